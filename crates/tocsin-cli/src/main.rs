//! The `tocsin` binary. Everything but the allocator is in the library
//! (`lib.rs`), so that cargo compiles it as soon as `tocsin-node`'s metadata
//! is ready, in parallel with `tocsin-node`'s code generation, rather than
//! after it: a binary waits for its dependencies' whole build, a library
//! only for their metadata. The overlap shortened a cold build's tail
//! after RocksDB from 222 to 214 s (BENCHMARKS.md, "The cold build"): the
//! two cores are busy either way, but no longer wait on one crate's
//! single-threaded front end.

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
