mod disk;
mod kernel;
mod race;
mod tools;
