mod agent;
mod provider;
