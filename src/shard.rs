//! `tessera shard cordon|uncordon|drain NAME`: what `kubectl cordon|uncordon|drain` do for a
//! node, for a shard of the federation. A drain cordons the shard and taints it
//! `tessera.io/drain:NoExecute`; the federation then moves every workload off it
//! (make-before-break, or stop-then-start for `AtMostOnce` ones, at most `--max-moving` at
//! once), and this command follows the Shard's status until nothing runs there.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::{Args, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::{Value, json};
use tessera_apiserver::catalog::Resource;
use tessera_apiserver::client::{Client, HttpClient};
use tessera_apiserver::request::{PatchType, find_resource};
use tessera_core::time::{now_secs, rfc3339};

/// The taint a drain puts on a shard.
pub const DRAIN_TAINT: &str = "tessera.io/drain";

/// `tessera shard …`.
#[derive(Subcommand)]
pub enum ShardCommand {
    /// Keep new work off a shard (what runs there stays).
    Cordon(ShardArgs),
    /// Let a shard take work again: lift its cordon and its drain taint.
    Uncordon(ShardArgs),
    /// Cordon a shard and move every federated workload off it, following the moves until
    /// none is left (Deployments and ReplicaSets are started elsewhere before their copy
    /// here goes; Jobs, CronJobs and StatefulSets are stopped here first).
    Drain(DrainArgs),
}

/// A shard, at a federation.
#[derive(Args)]
pub struct ShardArgs {
    /// The shard's name (`kubectl get shards`).
    pub name: String,
    /// The federation's kubeconfig (its current context is used).
    #[arg(long, env = "KUBECONFIG", default_value = "./data/kubeconfig")]
    pub kubeconfig: PathBuf,
}

/// Flags of `tessera shard drain`.
#[derive(Args)]
pub struct DrainArgs {
    #[command(flatten)]
    pub shard: ShardArgs,
    /// Give up waiting after this many seconds (the drain goes on at the federation).
    #[arg(long, default_value_t = 600)]
    pub timeout_seconds: u64,
    /// Only cordon and taint; do not wait for the moves.
    #[arg(long)]
    pub no_wait: bool,
}

fn shards() -> &'static Resource {
    find_resource("tessera.io", "v1alpha1", "shards").expect("served")
}

fn client(args: &ShardArgs) -> anyhow::Result<Arc<dyn Client>> {
    let http = HttpClient::from_kubeconfig(&args.kubeconfig)
        .map_err(|e| anyhow::anyhow!("{}", e.message))?;
    Ok(Arc::new(http))
}

/// The Shard `name`, or an error that says how to find the names.
async fn get(client: &dyn Client, name: &str) -> anyhow::Result<Value> {
    match client.get(shards(), None, name).await {
        Ok(s) => Ok(s),
        Err(e) if e.code == 404 => {
            anyhow::bail!("no shard {name:?} in this federation: `kubectl get shards` lists them")
        }
        Err(e) => anyhow::bail!("reading shard {name}: {}", e.message),
    }
}

/// Sets the shard's cordon and whether it carries the drain taint, onto the version read
/// (read again on a conflict); the admin's other taints stay.
async fn set(client: &dyn Client, name: &str, cordon: bool, drain: bool) -> anyhow::Result<()> {
    for _ in 0..10 {
        let shard = get(client, name).await?;
        let mut taints: Vec<Value> = shard["spec"]["taints"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|t| t["key"] != DRAIN_TAINT)
            .cloned()
            .collect();
        if drain {
            taints.push(json!({
                "key": DRAIN_TAINT,
                "effect": "NoExecute",
                "timeAdded": rfc3339(now_secs()),
            }));
        }
        let patch = json!({
            "metadata": {"resourceVersion": shard["metadata"]["resourceVersion"]},
            "spec": {"unschedulable": cordon, "taints": taints},
        });
        match client
            .patch(shards(), None, name, None, PatchType::Merge, &patch)
            .await
        {
            Ok(_) => return Ok(()),
            Err(e) if e.code == 409 => continue,
            Err(e) => anyhow::bail!("updating shard {name}: {}", e.message),
        }
    }
    anyhow::bail!("shard {name} kept changing under the update; try again")
}

/// Runs `tessera shard …`.
pub async fn run(cmd: ShardCommand) -> anyhow::Result<()> {
    match cmd {
        ShardCommand::Cordon(a) => {
            set(client(&a)?.as_ref(), &a.name, true, false).await?;
            println!("shard/{} cordoned", a.name);
        }
        ShardCommand::Uncordon(a) => {
            set(client(&a)?.as_ref(), &a.name, false, false).await?;
            println!("shard/{} uncordoned", a.name);
        }
        ShardCommand::Drain(a) => drain(a).await?,
    }
    Ok(())
}

fn count(shard: &Value, field: &str) -> u64 {
    shard["status"][field].as_u64().unwrap_or(0)
}

async fn drain(a: DrainArgs) -> anyhow::Result<()> {
    let name = &a.shard.name;
    let client = client(&a.shard)?;
    set(client.as_ref(), name, true, true).await?;
    println!("shard/{name} cordoned and tainted {DRAIN_TAINT}:NoExecute");
    if a.no_wait {
        return Ok(());
    }
    let first = count(&get(client.as_ref(), name).await?, "workloads");
    let bar = ProgressBar::new(first).with_style(
        ProgressStyle::with_template("moving workloads off {msg} {bar:30} {pos}/{len}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let deadline = tokio::time::Instant::now() + Duration::from_secs(a.timeout_seconds);
    loop {
        let shard = get(client.as_ref(), name).await?;
        let (left, moving) = (count(&shard, "workloads"), count(&shard, "movingOut"));
        bar.set_length(first.max(left));
        bar.set_position(first.max(left) - left);
        bar.set_message(format!("{name} ({moving} moving now)"));
        if left == 0 {
            bar.finish_and_clear();
            println!(
                "shard/{name} drained: no federated workload runs there (finished Jobs stay \
                 until deleted). Stop its agent to take it out, or `tessera shard uncordon {name}`."
            );
            return Ok(());
        }
        if tokio::time::Instant::now() >= deadline {
            bar.abandon();
            anyhow::bail!(
                "shard {name} still holds {left} workload(s) ({moving} moving) after {}s; the \
                 drain goes on. Workloads that fit on no other shard stay until room frees \
                 (`kubectl get events --field-selector involvedObject.kind=Shard` shows the moves)",
                a.timeout_seconds
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}
