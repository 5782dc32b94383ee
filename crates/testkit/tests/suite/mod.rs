mod checks;
mod deploy;
mod faults;
mod protocols;
mod scenario_files;
