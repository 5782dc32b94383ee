mod store;
mod unpack;
