//! The `wdp` binary; everything lives in the library (`wdp::cli`).

fn main() -> std::process::ExitCode {
    wdp::cli::main()
}
