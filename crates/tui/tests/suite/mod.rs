mod keys;
mod render;
