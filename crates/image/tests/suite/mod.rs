mod registry;
mod store;
mod unpack;
