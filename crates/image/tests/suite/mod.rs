mod changes;
mod compose;
mod flat;
mod registry;
mod store;
mod unpack;
