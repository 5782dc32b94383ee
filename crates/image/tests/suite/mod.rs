mod changes;
mod flat;
mod registry;
mod store;
mod unpack;
