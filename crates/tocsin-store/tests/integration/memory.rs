//! The memory gauges read the caches Tocsin uses: `bench restart` and
//! operators size a node's memory from them.

use rocksdb::WriteBatch;
use tocsin_store::keys;

use crate::support;

/// A key of group 7, made by the key module like every stored key.
fn key(i: u32) -> Vec<u8> {
    keys::with_group(7, &i.to_be_bytes())
}

fn gauge(store: &tocsin_store::Store, name: &str) -> u64 {
    store.memory_usage().into_iter().find(|(n, _)| *n == name).unwrap_or_else(|| panic!("{name} is reported")).1
}

/// Reading a table written to disk puts its blocks in the shared block
/// cache, and the gauge sees them (the DB-wide property it used to read
/// was the default column family's unused cache, always 0).
#[test]
fn block_cache_gauge_counts_blocks_read_from_tables() {
    let (_dir, store) = support::open_store();
    let cf = store.cf(keys::CF_TIMERS);

    // Phase: 10,000 keys flushed into a table, so reads go through the cache.
    let mut batch = WriteBatch::default();
    for i in 0u32..10_000 {
        batch.put_cf(cf, key(i), [i as u8; 100]);
    }
    store.db().write(batch).unwrap();
    store.db().flush_cf(cf).unwrap();

    // Phase: point reads load data blocks; the gauge reports them.
    for i in (0u32..10_000).step_by(97) {
        let value = store.db().get_cf(cf, key(i)).unwrap();
        assert_eq!(value.as_deref(), Some([i as u8; 100].as_slice()));
    }
    let cached = gauge(&store, "tocsin_rocksdb_block_cache_bytes");
    assert!(cached >= 64 << 10, "block cache after reading ~100 blocks: {cached} bytes");
}
