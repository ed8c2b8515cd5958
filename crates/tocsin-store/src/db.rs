//! The node's one RocksDB, shared by every Raft group, and its writer.
//!
//! **Group commit.** Every durable write (log appends, votes, applied state)
//! goes through one writer thread. It takes every request queued since its
//! last round, writes each batch to the memtable and WAL without syncing,
//! tells each caller "written" (so readers see it), then syncs the WAL once
//! and tells each caller "durable". One fsync thus covers the appends of all
//! the node's shards, and writes stay in submission order (openraft requires
//! votes and log writes in order).
//!
//! **Fail-stop.** If a write or a WAL sync fails, the writer latches failed:
//! that request and every later one get an error, which openraft turns into a
//! fatal storage error for the group. A failed fsync is never retried
//! (fsyncgate): the page cache may have dropped the dirty pages already.

use std::io;
use std::path::Path;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering;
use std::time::Instant;

use rocksdb::BlockBasedOptions;
use rocksdb::Cache;
use rocksdb::ColumnFamily;
use rocksdb::ColumnFamilyDescriptor;
use rocksdb::DB;
use rocksdb::Options;
use rocksdb::WriteBatch;
use rocksdb::WriteBufferManager;
use rocksdb::WriteOptions;
use tokio::sync::mpsc;
use tokio::sync::oneshot;

use crate::keys;

/// The on-disk format this build reads and writes. 2: the fire-time index
/// carries what is due (`keys::due_value`), in-flight attempts are indexed
/// at their deadline, and the shard meta carries the shard's clock. 3: a
/// node's address in memberships and the cluster map carries its peer
/// port apart from its client port. 4: the cluster map carries a cluster
/// id, quotas and signing secrets, and the horizon a per-namespace count of
/// unfinished timers (`keys::PENDING_MINUTE`). 5: a create command carries
/// `replace_finished`, and a cancelled timer may carry fire facts
/// (cancelled while its delivery went on). 6: a timer carries its attempt
/// history and a dead timer its reason, an attempt result carries what the
/// node saw of it, a pull callback its own time-to-run, and `Redrive`; a
/// timer its late-fire policy (`skip_if_late_ms`, state `SKIPPED`), and the
/// cluster map its paused namespaces and endpoints. 7: a create spec and a
/// timer carry a recurrence (a recurring timer's rule and series). 8: the
/// apply rules arm a push timer's first fire (`tocsin_core::arm`): a
/// `FIRING` record may hold an attempt that starts in the future, which a
/// build of format 7 would send at once after a leader change. The bytes
/// are format 7's, so a format-7 directory is opened and marked 8
/// ([`UPGRADES_FROM`]); a format-8 one is refused by a format-7 build.
pub const STORE_FORMAT: u32 = 8;

/// The older format this build opens as it is, marking it [`STORE_FORMAT`]:
/// format 8 changed what the apply rules write, not how anything is
/// encoded.
pub const UPGRADES_FROM: u32 = 7;

/// Most write requests queued for the writer before senders wait.
const WRITE_QUEUE_DEPTH: usize = 1024;
/// Most requests the writer folds into one sync round.
const MAX_REQUESTS_PER_ROUND: usize = 512;

/// How to open a node's store.
#[derive(Clone, Debug)]
pub struct StoreConfig {
    /// Directory holding the RocksDB files and the `snapshots/` directory.
    pub path: PathBuf,
    /// Shared LRU block cache for every column family.
    pub block_cache_bytes: usize,
    /// Cap on all memtables together, so memory stays bounded however many
    /// groups write.
    pub write_buffer_bytes: usize,
}

impl StoreConfig {
    pub fn new(path: impl Into<PathBuf>) -> StoreConfig {
        StoreConfig { path: path.into(), block_cache_bytes: 64 << 20, write_buffer_bytes: 128 << 20 }
    }
}

/// Counters the benchmark and the metrics exporter read.
#[derive(Debug, Default)]
pub struct StoreStats {
    /// WAL syncs performed.
    pub fsyncs: AtomicU64,
    /// Total time spent in WAL syncs.
    pub fsync_nanos: AtomicU64,
    /// Write batches written.
    pub batches: AtomicU64,
    /// Sync rounds: one per fsync, each covering one or more batches.
    pub rounds: AtomicU64,
    /// Batches written without asking for a sync of their own.
    pub unsynced: AtomicU64,
}

type OnDurable = Box<dyn FnOnce(io::Result<()>) + Send>;

/// Who hears that a batch is in the memtable (readable).
enum Written {
    Channel(oneshot::Sender<io::Result<()>>),
    Callback(Box<dyn FnOnce(io::Result<()>) + Send>),
}

impl Written {
    fn tell(self, res: io::Result<()>) {
        match self {
            Written::Channel(tx) => {
                let _ = tx.send(res);
            }
            Written::Callback(f) => f(res),
        }
    }
}

struct WriteRequest {
    batch: WriteBatch,
    /// Told once the batch is in the memtable (readable).
    written: Option<Written>,
    /// Called once the batch is durable (or failed). A request without one
    /// asks for no sync: the next round that syncs covers it, since the WAL
    /// is written in order.
    on_durable: Option<OnDurable>,
}

/// The node's RocksDB plus its writer thread.
pub struct Store {
    db: Arc<DB>,
    path: PathBuf,
    writer: mpsc::Sender<WriteRequest>,
    /// The writer thread, joined when the store is dropped (see `Drop`).
    writer_thread: Option<std::thread::JoinHandle<()>>,
    stats: Arc<StoreStats>,
    failed: Arc<AtomicBool>,
    /// The block cache every column family shares, kept for its usage:
    /// the DB-wide `rocksdb.block-cache-usage` property reads the default
    /// column family's cache, which Tocsin never uses, and so read 0.
    block_cache: Cache,
}

impl Drop for Store {
    /// Stops the writer thread and waits for it, so that the database is
    /// closed here rather than by a detached thread racing the process's
    /// exit: a RocksDB close that runs while `exit` destroys RocksDB's
    /// static state aborts the process ("pthread lock: Invalid argument",
    /// 4 SIGTERMs in 15 under load; the core showed the writer thread
    /// closing the DB).
    fn drop(&mut self) {
        // The store holds the only sender: dropping it ends the writer's loop.
        let (closed, _) = mpsc::channel(1);
        drop(std::mem::replace(&mut self.writer, closed));
        if let Some(thread) = self.writer_thread.take() {
            let _ = thread.join();
        }
    }
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store").field("path", &self.path).finish_non_exhaustive()
    }
}

impl Store {
    /// Opens (or creates) the store at `config.path` and starts its writer.
    pub fn open(config: &StoreConfig) -> io::Result<Arc<Store>> {
        std::fs::create_dir_all(config.path.join("snapshots"))?;
        let cache = Cache::new_lru_cache(config.block_cache_bytes);
        let write_buffers = WriteBufferManager::new_write_buffer_manager(config.write_buffer_bytes, true);

        let mut db_opts = Options::default();
        db_opts.create_if_missing(true);
        db_opts.create_missing_column_families(true);
        db_opts.set_write_buffer_manager(&write_buffers);
        db_opts.set_max_background_jobs(2);
        db_opts.set_keep_log_file_num(4);
        db_opts.set_max_total_wal_size(256 << 20);
        // The writer thread is the only writer and syncs the WAL itself once per
        // round: buffer WAL writes in RocksDB until that flush (one write and one
        // fsync per round instead of a write per batch), and do not spin-yield
        // waiting for other writers that never come.
        db_opts.set_manual_wal_flush(true);
        db_opts.set_enable_write_thread_adaptive_yield(false);

        let cfs = keys::ALL_CFS.iter().map(|name| ColumnFamilyDescriptor::new(*name, cf_options(name, &cache)));
        let db = DB::open_cf_descriptors(&db_opts, &config.path, cfs).map_err(to_io)?;
        check_format(&db, &config.path)?;
        let db = Arc::new(db);

        let (tx, rx) = mpsc::channel(WRITE_QUEUE_DEPTH);
        let stats = Arc::new(StoreStats::default());
        let failed = Arc::new(AtomicBool::new(false));
        let writer_thread = {
            let db = db.clone();
            let stats = stats.clone();
            let failed = failed.clone();
            std::thread::Builder::new()
                .name("tocsin-writer".into())
                .spawn(move || writer_loop(&db, rx, &stats, &failed))?
        };
        Ok(Arc::new(Store {
            db,
            path: config.path.clone(),
            writer: tx,
            writer_thread: Some(writer_thread),
            stats,
            failed,
            block_cache: cache,
        }))
    }

    pub fn db(&self) -> &Arc<DB> {
        &self.db
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn snapshot_dir(&self, group: keys::GroupId) -> PathBuf {
        self.path.join("snapshots").join(format!("{group}"))
    }

    pub fn stats(&self) -> &StoreStats {
        &self.stats
    }

    /// Whether a write or sync failed; the store then refuses all writes.
    pub fn has_failed(&self) -> bool {
        self.failed.load(Ordering::SeqCst)
    }

    /// RocksDB's own accounting, summed over column families, as
    /// `(metric name, value)`: memtables, table readers (index and filter
    /// blocks outside the cache), block cache, and write stalls.
    pub fn memory_usage(&self) -> Vec<(&'static str, u64)> {
        let per_cf = |property: &str| -> u64 {
            keys::ALL_CFS
                .iter()
                .filter_map(|name| self.db.property_int_value_cf(self.cf(name), property).ok().flatten())
                .sum()
        };
        let db = |property: &str| self.db.property_int_value(property).ok().flatten().unwrap_or(0);
        vec![
            ("tocsin_rocksdb_memtable_bytes", per_cf("rocksdb.cur-size-all-mem-tables")),
            ("tocsin_rocksdb_table_readers_bytes", per_cf("rocksdb.estimate-table-readers-mem")),
            ("tocsin_rocksdb_block_cache_bytes", self.block_cache.get_usage() as u64),
            ("tocsin_rocksdb_block_cache_pinned_bytes", self.block_cache.get_pinned_usage() as u64),
            ("tocsin_rocksdb_live_sst_bytes", per_cf("rocksdb.live-sst-files-size")),
            ("tocsin_rocksdb_write_stopped", per_cf("rocksdb.is-write-stopped")),
            ("tocsin_rocksdb_delayed_write_rate", db("rocksdb.actual-delayed-write-rate")),
        ]
    }

    pub fn cf(&self, name: &str) -> &ColumnFamily {
        self.db.cf_handle(name).unwrap_or_else(|| panic!("column family {name} is created at open"))
    }

    /// Writes `batch` and waits until it is durable.
    pub async fn write_durable(&self, batch: WriteBatch) -> io::Result<()> {
        let (tx, rx) = oneshot::channel();
        self.submit(WriteRequest {
            batch,
            written: None,
            on_durable: Some(Box::new(move |res| {
                let _ = tx.send(res);
            })),
        })
        .await?;
        rx.await.map_err(|_| io::Error::other("store writer stopped"))?
    }

    /// Writes `batch`, returns once it is readable, and calls `on_durable`
    /// once it is durable (possibly before this returns).
    pub async fn write_then(
        &self,
        batch: WriteBatch,
        on_durable: impl FnOnce(io::Result<()>) + Send + 'static,
    ) -> io::Result<()> {
        let (tx, rx) = oneshot::channel();
        self.submit(WriteRequest {
            batch,
            written: Some(Written::Channel(tx)),
            on_durable: Some(Box::new(on_durable)),
        })
        .await?;
        rx.await.map_err(|_| io::Error::other("store writer stopped"))?
    }

    /// Queues `batch` for the writer and returns once it is queued (waiting
    /// only if the queue is full): `on_written` is called once the batch is
    /// in the memtable, `on_durable` once it is synced. For callers that
    /// keep what they wrote readable themselves until then (the log's cache
    /// of recent entries), so their caller need not wait for the writer.
    pub async fn write_queued(
        &self,
        batch: WriteBatch,
        on_written: impl FnOnce(io::Result<()>) + Send + 'static,
        on_durable: impl FnOnce(io::Result<()>) + Send + 'static,
    ) -> io::Result<()> {
        self.submit(WriteRequest {
            batch,
            written: Some(Written::Callback(Box::new(on_written))),
            on_durable: Some(Box::new(on_durable)),
        })
        .await
    }

    /// Writes `batch` on the calling thread, unsynced: the writer's next
    /// sync covers it (the WAL is one ordered stream, whoever writes to it).
    /// For a blocking thread that has just built the batch (apply), so it
    /// need not hand it to the writer and wait to be woken. Honours and
    /// latches the store's failure like the writer does.
    pub fn write_now(&self, batch: WriteBatch) -> io::Result<()> {
        if self.failed.load(Ordering::SeqCst) {
            return Err(io::Error::other("store failed earlier; refusing writes"));
        }
        let mut no_sync = WriteOptions::default();
        no_sync.set_sync(false);
        self.db.write_opt(batch, &no_sync).map_err(to_io).inspect_err(|e| {
            tracing::error!(error = %e, "rocksdb write failed; store is now failed");
            self.failed.store(true, Ordering::SeqCst);
        })?;
        self.stats.batches.fetch_add(1, Ordering::Relaxed);
        self.stats.unsynced.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Writes `batch` and returns once it is readable, asking for no WAL
    /// sync of its own: it becomes durable with the next write that does
    /// (the WAL is written in order), or is lost in a crash together with
    /// everything written after it. For state that can be rebuilt from the
    /// log (applied state, the committed index): a round that holds only
    /// such writes costs no fsync.
    pub async fn write_unsynced(&self, batch: WriteBatch) -> io::Result<()> {
        let (tx, rx) = oneshot::channel();
        self.submit(WriteRequest { batch, written: Some(Written::Channel(tx)), on_durable: None }).await?;
        rx.await.map_err(|_| io::Error::other("store writer stopped"))?
    }

    async fn submit(&self, req: WriteRequest) -> io::Result<()> {
        self.writer.send(req).await.map_err(|_| io::Error::other("store writer stopped"))
    }
}

/// Refuses a data directory written in another format; stamps a new one.
fn check_format(db: &DB, path: &Path) -> io::Result<()> {
    let meta = db.cf_handle(keys::CF_RAFT_META).expect("created at open");
    let format_key = keys::tag_key(keys::NODE_GROUP, keys::raft_meta::FORMAT);
    match db.get_cf(meta, format_key).map_err(to_io)? {
        Some(v) if v.as_slice() == STORE_FORMAT.to_be_bytes() => Ok(()),
        Some(v) if v.as_slice() == UPGRADES_FROM.to_be_bytes() => {
            tracing::info!(path = %path.display(), from = UPGRADES_FROM, to = STORE_FORMAT, "marking the store's format");
            let mut batch = WriteBatch::default();
            batch.put_cf(meta, format_key, STORE_FORMAT.to_be_bytes());
            db.write(batch).map_err(to_io)?;
            db.flush_wal(true).map_err(to_io)
        }
        found => {
            let hosted = db.get_cf(meta, keys::tag_key(keys::NODE_GROUP, keys::raft_meta::HOSTED)).map_err(to_io)?;
            if found.is_some() || hosted.is_some() {
                let version = found
                    .and_then(|v| <[u8; 4]>::try_from(v.as_slice()).ok())
                    .map_or("1".to_string(), |b| u32::from_be_bytes(b).to_string());
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!(
                        "{} holds store format {version}; this build reads format {STORE_FORMAT} (and \
                         {UPGRADES_FROM}, which it marks {STORE_FORMAT}) only (see docs/storage.md): start it \
                         on an empty data directory",
                        path.display()
                    ),
                ));
            }
            let mut batch = WriteBatch::default();
            batch.put_cf(meta, format_key, STORE_FORMAT.to_be_bytes());
            db.write(batch).map_err(to_io)?;
            // Manual WAL flushing is on (see `open`): flush and sync here.
            db.flush_wal(true).map_err(to_io)
        }
    }
}

fn cf_options(name: &str, cache: &Cache) -> Options {
    let mut block = BlockBasedOptions::default();
    block.set_block_cache(cache);
    block.set_cache_index_and_filter_blocks(true);
    block.set_pin_l0_filter_and_index_blocks_in_cache(true);
    // Partitioned index and filters: a table's index is a top level (pinned)
    // over 4 KiB partitions that go through the block cache like data. With
    // one index block per table, a 256 MiB table's index was about 2 MiB,
    // larger than a block-cache shard holds, so it never stayed cached and
    // every point lookup read, checksummed and decompressed it again
    // (measured: a 1,000,000-timer burst applied about 8 ms per command,
    // 62% of CPU in LZ4_decompress_safe under BlockBasedTable's index read).
    block.set_index_type(rocksdb::BlockBasedIndexType::TwoLevelIndexSearch);
    block.set_partition_filters(true);
    block.set_pin_top_level_index_and_filter(true);
    block.set_cache_index_and_filter_blocks_with_high_priority(true);
    if name == keys::CF_TIMERS {
        // Point lookups on every create, cancel and fire.
        block.set_bloom_filter(10.0, false);
    }
    let mut opts = Options::default();
    opts.set_block_based_table_factory(&block);
    // Only timer rows (with payloads) are worth compressing. Log entries live
    // until the next snapshot, and index keys are short: compressing them
    // would spend CPU in every flush and compaction for little disk.
    opts.set_compression_type(if name == keys::CF_TIMERS {
        rocksdb::DBCompressionType::Lz4
    } else {
        rocksdb::DBCompressionType::None
    });
    if matches!(name, keys::CF_DUE | keys::CF_RETENTION | keys::CF_RAFT_LOG) {
        // These are queues: written once, read in order, deleted. Compact files
        // dense with tombstones so range scans from the head stay fast.
        opts.add_compact_on_deletion_collector_factory(10_000, 5_000, 0.5);
    }
    opts
}

fn writer_loop(db: &DB, mut rx: mpsc::Receiver<WriteRequest>, stats: &StoreStats, failed: &AtomicBool) {
    let mut no_sync = WriteOptions::default();
    no_sync.set_sync(false);
    let mut round: Vec<(OnDurable, io::Result<()>)> = Vec::with_capacity(MAX_REQUESTS_PER_ROUND);
    while let Some(first) = rx.blocking_recv() {
        stall_if_asked();
        let mut next = Some(first);
        let mut requests = 0;
        while let Some(req) = next.take() {
            requests += 1;
            let res = if failed.load(Ordering::SeqCst) {
                Err(io::Error::other("store failed earlier; refusing writes"))
            } else {
                db.write_opt(req.batch, &no_sync).map_err(to_io)
            };
            if let Err(e) = &res {
                tracing::error!(error = %e, "rocksdb write failed; store is now failed");
                failed.store(true, Ordering::SeqCst);
            }
            stats.batches.fetch_add(1, Ordering::Relaxed);
            if let Some(written) = req.written {
                written.tell(res.as_ref().map(|_| ()).map_err(clone_err));
            }
            match req.on_durable {
                Some(on_durable) => round.push((on_durable, res)),
                None => {
                    stats.unsynced.fetch_add(1, Ordering::Relaxed);
                }
            }
            if requests < MAX_REQUESTS_PER_ROUND {
                next = rx.try_recv().ok();
            }
        }
        if round.is_empty() {
            // Nothing in this round asked to be durable: its writes wait in
            // the WAL buffer for the next round that syncs.
            continue;
        }
        let sync_res = if failed.load(Ordering::SeqCst) {
            Err(io::Error::other("store failed; not syncing"))
        } else {
            let started = Instant::now();
            let res = db.flush_wal(true).map_err(to_io);
            let nanos = started.elapsed().as_nanos() as u64;
            stats.fsyncs.fetch_add(1, Ordering::Relaxed);
            stats.fsync_nanos.fetch_add(nanos, Ordering::Relaxed);
            metrics::counter!("tocsin_store_fsync_total").increment(1);
            metrics::histogram!("tocsin_store_fsync_seconds").record(nanos as f64 / 1e9);
            metrics::histogram!("tocsin_store_batches_per_fsync").record(round.len() as f64);
            if let Err(e) = &res {
                tracing::error!(error = %e, "wal sync failed; store is now failed");
                failed.store(true, Ordering::SeqCst);
            }
            res
        };
        stats.rounds.fetch_add(1, Ordering::Relaxed);
        for (on_durable, res) in round.drain(..) {
            let res = match (&res, &sync_res) {
                (Err(e), _) | (Ok(()), Err(e)) => Err(clone_err(e)),
                (Ok(()), Ok(())) => Ok(()),
            };
            on_durable(res);
        }
    }
}

/// The `store::writer` fault point (test builds only; see `tocsin-node`'s
/// `fault.rs`): `return(delay:<ms>)` stalls this write round, as a slow or
/// stuck disk would.
fn stall_if_asked() {
    if !cfg!(debug_assertions) {
        return;
    }
    if let Some(arg) = fail::eval("store::writer", |arg| arg.unwrap_or_default())
        && let Some(ms) = arg.strip_prefix("delay:").and_then(|ms| ms.parse::<u64>().ok())
    {
        tracing::warn!(ms, "fault point: stalling the store writer");
        std::thread::sleep(std::time::Duration::from_millis(ms));
    }
}

fn clone_err(e: &io::Error) -> io::Error {
    io::Error::new(e.kind(), e.to_string())
}

pub(crate) fn to_io(e: rocksdb::Error) -> io::Error {
    let kind = match e.kind() {
        rocksdb::ErrorKind::NotFound => io::ErrorKind::NotFound,
        rocksdb::ErrorKind::Corruption => io::ErrorKind::InvalidData,
        rocksdb::ErrorKind::IOError => io::ErrorKind::Other,
        _ => io::ErrorKind::Other,
    };
    io::Error::new(kind, e.into_string())
}
