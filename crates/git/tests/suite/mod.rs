mod attacks;
mod checkpoints;
mod commit;
mod remote;
mod ssh;
