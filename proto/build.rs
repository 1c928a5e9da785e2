//! Generates the tonic client and server for `inference.v1` with a vendored
//! `protoc`, so no system protobuf compiler is needed.
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    // SAFETY: build scripts are single-threaded; nothing else reads the env concurrently.
    unsafe { std::env::set_var("PROTOC", protoc) };
    println!("cargo:rerun-if-changed=inference/v1/worker.proto");
    tonic_prost_build::configure()
        // Small per-call buffers (see src/codec.rs).
        .codec_path("crate::codec::CompactCodec")
        .compile_protos(&["inference/v1/worker.proto"], &["."])?;
    Ok(())
}
