mod clients;
mod connect;
mod fetch;
mod plain;
mod presets;
mod secrets;
