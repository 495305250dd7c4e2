//! Finds libllminfer through the `pkg-config` program (no helper crate, so
//! the build needs nothing but std) and tells rustc where to link it from.

use std::env;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-env-changed=PKG_CONFIG_PATH");
    println!("cargo:rerun-if-env-changed=PKG_CONFIG");
    println!("cargo:rerun-if-env-changed=LLMINFER_LIB_DIR");

    // An explicit directory wins, for machines without pkg-config.
    if let Ok(dir) = env::var("LLMINFER_LIB_DIR") {
        println!("cargo:rustc-link-search=native={}", dir);
        println!("cargo:rustc-link-lib=dylib=llminfer");
        return;
    }

    let program = env::var("PKG_CONFIG").unwrap_or_else(|_| "pkg-config".to_string());
    let output = match Command::new(&program).args(["--libs", "llminfer"]).output() {
        Ok(output) => output,
        Err(err) => panic!(
            "\n\nllminfer-sys: could not run `{}` ({}).\n\
             Install pkg-config, or set LLMINFER_LIB_DIR to the directory holding \
             libllminfer.so.\n\n",
            program, err
        ),
    };
    if !output.status.success() {
        panic!(
            "\n\nllminfer-sys: `{} --libs llminfer` failed: llminfer.pc was not found.\n\
             Install libllminfer, then point PKG_CONFIG_PATH at <prefix>/lib/pkgconfig \
             (now: {:?}).\n{}\n",
            program,
            env::var("PKG_CONFIG_PATH").unwrap_or_default(),
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }

    let flags = String::from_utf8_lossy(&output.stdout);
    let mut linked = false;
    for flag in flags.split_whitespace() {
        if let Some(dir) = flag.strip_prefix("-L") {
            println!("cargo:rustc-link-search=native={}", dir);
            // Lets dependants (and their build scripts) see where it came from.
            println!("cargo:lib_dir={}", dir);
        } else if let Some(lib) = flag.strip_prefix("-l") {
            println!("cargo:rustc-link-lib={}", lib);
            linked |= lib == "llminfer";
        }
    }
    if !linked {
        println!("cargo:rustc-link-lib=dylib=llminfer");
    }
}
