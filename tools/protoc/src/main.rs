//! A `protoc` stand-in for build scripts: compiles `.proto` files to a `FileDescriptorSet` with
//! protox, which carries Google's well-known types itself.
//!
//! Dependencies such as `etcd-client` compile their `.proto` files through `prost-build`, which
//! runs the program named by `PROTOC`. The workspace's `.cargo/config.toml` points `PROTOC` at
//! this binary (installed by `scripts/setup.sh`), so a build reads no system `protoc` and no
//! `/usr/include/google`. It accepts the arguments `prost-build` passes:
//! `--include_imports`, `--include_source_info`, `-o FILE`, `-I DIR` (or `--proto_path`) and
//! the files, in protoc's spellings.

use std::path::PathBuf;
use std::process::ExitCode;

/// What one invocation asks for.
#[derive(Debug, Default, PartialEq)]
struct Invocation {
    includes: Vec<PathBuf>,
    files: Vec<PathBuf>,
    output: Option<PathBuf>,
    include_imports: bool,
    include_source_info: bool,
    version: bool,
}

/// Reads protoc's command line; anything it does not know is an error that names it.
fn parse(args: impl IntoIterator<Item = String>) -> Result<Invocation, String> {
    let mut inv = Invocation::default();
    let mut args = args.into_iter();
    while let Some(arg) = args.next() {
        let mut value = |flag: &str, inline: Option<&str>| -> Result<PathBuf, String> {
            match inline {
                Some(v) => Ok(PathBuf::from(v)),
                None => args
                    .next()
                    .map(PathBuf::from)
                    .ok_or_else(|| format!("{flag} needs a value")),
            }
        };
        match arg.as_str() {
            "--version" => inv.version = true,
            "--include_imports" => inv.include_imports = true,
            "--include_source_info" => inv.include_source_info = true,
            // proto3 optional fields are always accepted by protox.
            "--experimental_allow_proto3_optional" => {}
            "-o" | "--descriptor_set_out" => inv.output = Some(value(&arg, None)?),
            "-I" | "--proto_path" => inv.includes.push(value(&arg, None)?),
            _ => {
                if let Some(dir) = arg.strip_prefix("-I") {
                    inv.includes.push(value("-I", Some(dir))?);
                } else if let Some(path) = arg.strip_prefix("--proto_path=") {
                    inv.includes.push(value("--proto_path", Some(path))?);
                } else if let Some(path) = arg.strip_prefix("-o") {
                    inv.output = Some(value("-o", Some(path))?);
                } else if let Some(path) = arg.strip_prefix("--descriptor_set_out=") {
                    inv.output = Some(value("--descriptor_set_out", Some(path))?);
                } else if arg.starts_with('-') {
                    return Err(format!(
                        "unsupported option {arg:?}: this protoc stand-in only writes descriptor sets (-o)"
                    ));
                } else {
                    inv.files.push(PathBuf::from(arg));
                }
            }
        }
    }
    if inv.includes.is_empty() {
        inv.includes.push(PathBuf::from("."));
    }
    Ok(inv)
}

fn run(inv: &Invocation) -> Result<(), String> {
    if inv.files.is_empty() {
        return Err("no .proto files given".into());
    }
    let output = inv
        .output
        .as_ref()
        .ok_or("no output given: pass -o FILE (only descriptor sets are written)")?;
    let mut compiler = protox::Compiler::new(&inv.includes).map_err(|e| e.to_string())?;
    compiler
        .include_imports(inv.include_imports)
        .include_source_info(inv.include_source_info);
    compiler
        .open_files(&inv.files)
        .map_err(|e| format!("{e:?}"))?;
    std::fs::write(output, compiler.encode_file_descriptor_set())
        .map_err(|e| format!("writing {}: {e}", output.display()))
}

fn main() -> ExitCode {
    let inv = match parse(std::env::args().skip(1)) {
        Ok(inv) => inv,
        Err(e) => {
            eprintln!("tessera-protoc: {e}");
            return ExitCode::from(2);
        }
    };
    if inv.version {
        // prost-build and tonic-build do not ask; humans and scripts checking a protoc do.
        println!(
            "libprotoc 3.21 (tessera-protoc {}, protox)",
            env!("CARGO_PKG_VERSION")
        );
        return ExitCode::SUCCESS;
    }
    match run(&inv) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tessera-protoc: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn parses_prost_builds_command_line() {
        let inv = parse(args(
            "--include_imports --include_source_info -o out/set -I proto -Iother a.proto b.proto",
        ))
        .expect("valid");
        assert_eq!(
            inv,
            Invocation {
                includes: vec!["proto".into(), "other".into()],
                files: vec!["a.proto".into(), "b.proto".into()],
                output: Some("out/set".into()),
                include_imports: true,
                include_source_info: true,
                version: false,
            }
        );
    }

    #[test]
    fn refuses_what_it_cannot_do() {
        assert!(
            parse(args("--rust_out=x a.proto"))
                .expect_err("refused")
                .contains("--rust_out")
        );
        assert!(
            parse(args("-o"))
                .expect_err("refused")
                .contains("needs a value")
        );
        let no_output = parse(args("a.proto")).expect("parses");
        assert!(run(&no_output).expect_err("refused").contains("-o FILE"));
    }

    #[test]
    fn compiles_a_file_that_imports_well_known_types_without_system_includes() {
        let dir = std::env::temp_dir().join(format!("tessera-protoc-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("tempdir");
        std::fs::write(
            dir.join("v.proto"),
            "syntax = \"proto3\";\nimport \"google/protobuf/descriptor.proto\";\n\
             extend google.protobuf.FieldOptions { string tag = 50001; }\n\
             message M { string a = 1 [(tag) = \"x\"]; }\n",
        )
        .expect("write proto");
        let out = dir.join("set.bin");
        let inv = Invocation {
            includes: vec![dir.clone()],
            files: vec![dir.join("v.proto")],
            output: Some(out.clone()),
            include_imports: true,
            ..Invocation::default()
        };
        run(&inv).expect("compiles");
        let bytes = std::fs::read(&out).expect("output written");
        // The set holds the imported descriptor.proto too (include_imports).
        let text = String::from_utf8_lossy(&bytes);
        assert!(
            text.contains("google/protobuf/descriptor.proto"),
            "imports included"
        );
        assert!(text.contains("v.proto"));
        std::fs::remove_dir_all(&dir).ok();
    }
}
