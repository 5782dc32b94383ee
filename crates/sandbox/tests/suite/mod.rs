mod api;
mod api_microvm;
mod egress;
mod hostile_supervisor;
mod vnc;
