//! Writes the CiliumNode CRD generated from eni-operator's types.
//!
//! `crd-gen` writes `manifests/crd/ciliumnodes.cilium.io.yaml` (relative to the workspace root);
//! `crd-gen --stdout` prints it instead.

use std::path::PathBuf;
use std::process::ExitCode;

const TARGET: &str = "manifests/crd/ciliumnodes.cilium.io.yaml";

fn main() -> ExitCode {
    let yaml = eni_operator::crd::crd_yaml();
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.as_slice() {
        [] => {
            // The workspace root is this crate's parent, wherever cargo is run from.
            let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("..")
                .join(TARGET);
            match std::fs::write(&path, yaml) {
                Ok(()) => {
                    println!("wrote {TARGET}");
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("error: cannot write {}: {e}", path.display());
                    ExitCode::from(1)
                }
            }
        }
        [flag] if flag == "--stdout" => {
            print!("{yaml}");
            ExitCode::SUCCESS
        }
        _ => {
            eprintln!("usage: crd-gen [--stdout]");
            ExitCode::from(2)
        }
    }
}
