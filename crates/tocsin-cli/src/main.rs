//! The `tocsin` binary. Everything but the allocator is in the library
//! (`lib.rs`), so that cargo compiles it as soon as `tocsin-node`'s metadata
//! is ready, in parallel with `tocsin-node`'s code generation, rather than
//! after it: a binary waits for its dependencies' whole build, a library
//! only for their metadata. That overlap is about a minute of a cold
//! build's single-crate tail (BENCHMARKS.md, "The cold build").

/// mimalloc instead of glibc's malloc: a node allocates and frees small
/// buffers on every request, entry and message across a dozen threads, and
/// glibc's arenas showed as 6–8% of a loaded node's CPU (`_int_malloc`,
/// `_int_free`, `malloc_consolidate`, `unlink_chunk`). A/B figures in
/// docs/perf-history.md.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    tocsin_cli::main()
}
