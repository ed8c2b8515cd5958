//! Creates a timer, reads it back, cancels it, and creates a batch, against
//! a running cluster.
//!
//! ```sh
//! tocsin dev &                                            # or any cluster
//! cargo run -p tocsin-client --example quickstart -- 127.0.0.1:7070
//! ```

use tocsin_client::Client;
use tocsin_client::v1 as pb;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let seeds: Vec<String> = std::env::args().skip(1).collect();
    let seeds = if seeds.is_empty() { vec!["127.0.0.1:7070".to_string()] } else { seeds };
    let client = Client::connect(seeds).await?;
    println!("connected: {} shards, map epoch {}", client.num_shards(), client.map_epoch());

    // A timer that would POST to a receiver in 30 minutes. The id is ours:
    // creating it again with the same spec is harmless.
    let req = tocsin_client::webhook_timer("orders", "order-42", 30 * 60 * 1000, "http://127.0.0.1:9000/hook");
    let created = client.create_timer(req.clone()).await?;
    println!("created={} shard={}", created.created, client.shard_of("orders", "order-42"));
    let again = client.create_timer(req).await?;
    assert!(!again.created, "an identical create returns the existing timer");

    let timer = client.get_timer("orders", "order-42").await?;
    println!("state={:?} fire_at_ms={}", pb::timer::State::try_from(timer.state), timer.fire_at_ms);

    // Cancelling gives a definite answer.
    let cancel = client.cancel_timer("orders", "order-42").await?;
    println!("cancel: {:?}", pb::cancel_timer_response::Outcome::try_from(cancel.outcome));

    // A batch is split per leader node: one call to each node that leads
    // some of its shards.
    let batch: Vec<_> = (0..100)
        .map(|i| tocsin_client::webhook_timer("orders", &format!("batch-{i}"), 60_000, "http://127.0.0.1:9000/hook"))
        .collect();
    let ok = client.create_timers(batch).await.iter().filter(|r| r.is_ok()).count();
    println!("batch: {ok} of 100 created");
    Ok(())
}
