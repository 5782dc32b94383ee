//! The sandbox supervisor on its own, for programs that embed
//! `cordon-sandbox` but cannot call the hook at the top of their own `main`
//! (set `SandboxConfig::supervisor` or `CORDON_SUPERVISOR` to this binary).
//! The `cordon` binary does not need it: it is its own supervisor.

fn main() {
    cordon_sandbox::supervisor::run_if_supervisor();
    eprintln!(
        "cordon-supervisor is started by cordon-sandbox, not by hand (expected the argument {})",
        cordon_sandbox::supervisor::SUPERVISOR_ARG
    );
    std::process::exit(2);
}
