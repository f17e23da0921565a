//! The scheduler's configuration file, in the shape of kube-scheduler's
//! `KubeSchedulerConfiguration` (YAML or JSON): profiles by `schedulerName`, each enabling,
//! disabling and weighting plugins per extension point (or for all of a plugin's points with
//! `multiPoint`), with `pluginConfig` args.

use std::collections::HashMap;
use std::sync::Arc;

use serde::Deserialize;
use serde_json::Value;

use crate::framework::{Handle, Plugin};
use crate::plugins;

/// The file.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SchedulerConfig {
    /// `kubescheduler.config.k8s.io/v1` (accepted and ignored).
    #[serde(default)]
    pub api_version: Option<String>,
    /// `KubeSchedulerConfiguration` (accepted and ignored).
    #[serde(default)]
    pub kind: Option<String>,
    /// Percent of nodes to find feasible before scoring (0: adaptive, as kube-scheduler).
    #[serde(default)]
    pub percentage_of_nodes_to_score: Option<u32>,
    /// Scheduling workers: how many pods are placed at once, each against the same
    /// snapshot, committed only if what they read has not moved (kube-scheduler's field of
    /// this name sets the parallelism of its filter loop; default: the machine's cores).
    #[serde(default)]
    pub parallelism: Option<u32>,
    /// First backoff of a pod that failed (seconds, default 1).
    #[serde(default)]
    pub pod_initial_backoff_seconds: Option<u64>,
    /// Longest backoff (seconds, default 10).
    #[serde(default)]
    pub pod_max_backoff_seconds: Option<u64>,
    /// Profiles (default: one `default-scheduler` with the default plugins).
    #[serde(default)]
    pub profiles: Vec<ProfileConfig>,
}

/// One profile.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ProfileConfig {
    /// Pods with this `spec.schedulerName` are this profile's.
    #[serde(default = "default_name")]
    pub scheduler_name: String,
    /// Plugin changes against the defaults.
    #[serde(default)]
    pub plugins: Option<PluginsConfig>,
    /// Args of plugins.
    #[serde(default)]
    pub plugin_config: Vec<PluginArgs>,
}

fn default_name() -> String {
    "default-scheduler".into()
}

/// Per extension point changes.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PluginsConfig {
    /// Every point a plugin implements.
    #[serde(default)]
    pub multi_point: PluginSet,
    /// QueueSort.
    #[serde(default)]
    pub queue_sort: PluginSet,
    /// PreFilter.
    #[serde(default)]
    pub pre_filter: PluginSet,
    /// Filter.
    #[serde(default)]
    pub filter: PluginSet,
    /// PostFilter.
    #[serde(default)]
    pub post_filter: PluginSet,
    /// PreScore.
    #[serde(default)]
    pub pre_score: PluginSet,
    /// Score.
    #[serde(default)]
    pub score: PluginSet,
    /// Reserve.
    #[serde(default)]
    pub reserve: PluginSet,
    /// Permit.
    #[serde(default)]
    pub permit: PluginSet,
    /// PreBind.
    #[serde(default)]
    pub pre_bind: PluginSet,
    /// Bind.
    #[serde(default)]
    pub bind: PluginSet,
}

/// Enabled and disabled plugins (`*` disables every default).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PluginSet {
    /// Added (or re-weighted).
    #[serde(default)]
    pub enabled: Vec<PluginRef>,
    /// Removed.
    #[serde(default)]
    pub disabled: Vec<PluginRef>,
}

/// A plugin by name, with a Score weight.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PluginRef {
    /// Its name.
    pub name: String,
    /// Its Score weight (default 1).
    #[serde(default)]
    pub weight: Option<i64>,
}

/// A plugin's args.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PluginArgs {
    /// The plugin.
    pub name: String,
    /// Its args.
    #[serde(default)]
    pub args: Value,
}

/// The extension points, in cycle order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Point {
    /// QueueSort.
    QueueSort,
    /// PreFilter.
    PreFilter,
    /// Filter.
    Filter,
    /// PostFilter.
    PostFilter,
    /// PreScore.
    PreScore,
    /// Score.
    Score,
    /// Reserve.
    Reserve,
    /// Permit.
    Permit,
    /// PreBind.
    PreBind,
    /// Bind.
    Bind,
}

impl Point {
    const ALL: [Point; 10] = [
        Point::QueueSort,
        Point::PreFilter,
        Point::Filter,
        Point::PostFilter,
        Point::PreScore,
        Point::Score,
        Point::Reserve,
        Point::Permit,
        Point::PreBind,
        Point::Bind,
    ];

    fn implemented_by(self, p: &dyn Plugin) -> bool {
        match self {
            Point::QueueSort => p.queue_sort().is_some(),
            Point::PreFilter => p.pre_filter().is_some(),
            Point::Filter => p.filter().is_some(),
            Point::PostFilter => p.post_filter().is_some(),
            Point::PreScore => p.pre_score().is_some(),
            Point::Score => p.score().is_some(),
            Point::Reserve => p.reserve().is_some(),
            Point::Permit => p.permit().is_some(),
            Point::PreBind => p.pre_bind().is_some(),
            Point::Bind => p.bind().is_some(),
        }
    }

    fn defaults(self) -> &'static [(&'static str, i64)] {
        match self {
            Point::QueueSort => &[("PrioritySort", 1)],
            Point::PreFilter => &[
                ("NodeAffinity", 1),
                ("NodePorts", 1),
                ("NodeResourcesFit", 1),
                ("PodTopologySpread", 1),
                ("InterPodAffinity", 1),
                ("Coscheduling", 1),
            ],
            Point::Filter => &[
                ("NodeUnschedulable", 1),
                ("NodeName", 1),
                ("TaintToleration", 1),
                ("NodeAffinity", 1),
                ("NodePorts", 1),
                ("NodeResourcesFit", 1),
                ("PodTopologySpread", 1),
                ("InterPodAffinity", 1),
            ],
            Point::PreScore => &[
                ("TaintToleration", 1),
                ("NodeAffinity", 1),
                ("PodTopologySpread", 1),
                ("InterPodAffinity", 1),
            ],
            Point::Score => &[
                ("TaintToleration", 3),
                ("NodeAffinity", 2),
                ("NodeResourcesFit", 1),
                ("NodeResourcesBalancedAllocation", 1),
                ("PodTopologySpread", 2),
                ("InterPodAffinity", 2),
            ],
            Point::PostFilter => &[("DefaultPreemption", 1), ("Coscheduling", 1)],
            Point::Reserve | Point::Permit => &[("Coscheduling", 1)],
            Point::Bind => &[("Coscheduling", 1), ("DefaultBinder", 1)],
            Point::PreBind => &[],
        }
    }

    fn set(self, c: &PluginsConfig) -> &PluginSet {
        match self {
            Point::QueueSort => &c.queue_sort,
            Point::PreFilter => &c.pre_filter,
            Point::Filter => &c.filter,
            Point::PostFilter => &c.post_filter,
            Point::PreScore => &c.pre_score,
            Point::Score => &c.score,
            Point::Reserve => &c.reserve,
            Point::Permit => &c.permit,
            Point::PreBind => &c.pre_bind,
            Point::Bind => &c.bind,
        }
    }
}

/// Plugins at one extension point, in order, with their Score weights.
pub type Enabled = Vec<(Arc<dyn Plugin>, i64)>;

/// A profile's plugins per extension point, built.
pub struct Profile {
    /// Its `schedulerName`.
    pub scheduler_name: String,
    /// Plugins per point, in order, with Score weights.
    pub points: HashMap<Point, Enabled>,
}

impl Profile {
    /// The plugins at `point`.
    pub fn at(&self, point: Point) -> &[(Arc<dyn Plugin>, i64)] {
        self.points.get(&point).map_or(&[], Vec::as_slice)
    }
}

/// Parses a configuration file's text (YAML or JSON).
pub fn parse(text: &str) -> Result<SchedulerConfig, String> {
    let v = tessera_client::yaml::to_json(text.as_bytes())?;
    serde_json::from_value(v).map_err(|e| format!("the scheduler configuration is not valid: {e}"))
}

/// Most scheduling workers.
pub const MAX_PARALLELISM: u32 = 256;

impl SchedulerConfig {
    /// Scheduling workers: `parallelism`, or the machine's cores.
    pub fn workers(&self) -> usize {
        self.parallelism.map_or_else(
            || std::thread::available_parallelism().map_or(1, |n| n.get()),
            |p| p as usize,
        )
    }

    /// Builds every profile, checking names, points and args.
    pub fn build(&self, handle: &Handle) -> Result<Vec<Profile>, String> {
        if let Some(p) = self.percentage_of_nodes_to_score
            && p > 100
        {
            return Err(format!(
                "percentageOfNodesToScore is {p}; it must be between 0 and 100"
            ));
        }
        if let Some(p) = self.parallelism
            && !(1..=MAX_PARALLELISM).contains(&p)
        {
            return Err(format!(
                "parallelism is {p}; it must be between 1 and {MAX_PARALLELISM}"
            ));
        }
        let default = [ProfileConfig {
            scheduler_name: default_name(),
            ..Default::default()
        }];
        let profiles = if self.profiles.is_empty() {
            &default[..]
        } else {
            &self.profiles[..]
        };
        let mut out: Vec<Profile> = Vec::new();
        for pc in profiles {
            if out.iter().any(|p| p.scheduler_name == pc.scheduler_name) {
                return Err(format!(
                    "two profiles are named {:?}; schedulerName must be unique",
                    pc.scheduler_name
                ));
            }
            out.push(build_profile(pc, handle)?);
        }
        Ok(out)
    }
}

fn build_profile(pc: &ProfileConfig, handle: &Handle) -> Result<Profile, String> {
    let ctx = |e: String| format!("profile {:?}: {e}", pc.scheduler_name);
    let empty = PluginsConfig::default();
    let changes = pc.plugins.as_ref().unwrap_or(&empty);
    let mut instances: HashMap<String, Arc<dyn Plugin>> = HashMap::new();
    let mut instance = |name: &str| -> Result<Arc<dyn Plugin>, String> {
        if let Some(p) = instances.get(name) {
            return Ok(p.clone());
        }
        let args = pc
            .plugin_config
            .iter()
            .find(|a| a.name == name)
            .map_or(Value::Null, |a| a.args.clone());
        let p = plugins::build(name, &args, handle)?;
        instances.insert(name.to_owned(), p.clone());
        Ok(p)
    };
    for a in &pc.plugin_config {
        if !plugins::NAMES.contains(&a.name.as_str()) {
            return Err(ctx(format!(
                "pluginConfig names unknown plugin {:?}",
                a.name
            )));
        }
    }
    let mut points = HashMap::new();
    for point in Point::ALL {
        let set = point.set(changes);
        let disabled = |name: &str| {
            set.disabled
                .iter()
                .chain(&changes.multi_point.disabled)
                .any(|d| d.name == "*" || d.name == name)
        };
        let mut list: Vec<(Arc<dyn Plugin>, i64)> = Vec::new();
        for (name, weight) in point.defaults() {
            if !disabled(name) {
                list.push((instance(name).map_err(ctx)?, *weight));
            }
        }
        let multi = changes.multi_point.enabled.iter().map(|r| (r, true));
        for (r, from_multi) in multi.chain(set.enabled.iter().map(|r| (r, false))) {
            let p = instance(&r.name).map_err(ctx)?;
            if !point.implemented_by(p.as_ref()) {
                if from_multi {
                    continue;
                }
                return Err(ctx(format!(
                    "plugin {:?} does not implement the {point:?} extension point",
                    r.name
                )));
            }
            let weight = r.weight.unwrap_or(1);
            if point == Point::Score && !(1..=100).contains(&weight) {
                return Err(ctx(format!(
                    "score weight of {:?} is {weight}; it must be between 1 and 100",
                    r.name
                )));
            }
            match list.iter_mut().find(|(x, _)| x.name() == r.name) {
                Some(entry) => entry.1 = weight,
                None => list.push((p, weight)),
            }
        }
        points.insert(point, list);
    }
    let count = |p: Point| points.get(&p).map_or(0, Vec::len);
    if count(Point::QueueSort) != 1 {
        return Err(ctx(format!(
            "exactly one queueSort plugin must be enabled, found {}",
            count(Point::QueueSort)
        )));
    }
    if count(Point::Bind) == 0 {
        return Err(ctx("at least one bind plugin must be enabled".into()));
    }
    Ok(Profile {
        scheduler_name: pc.scheduler_name.clone(),
        points,
    })
}
