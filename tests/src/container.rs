//! tracer's image run the way `deploy/kubernetes/daemonset.yaml` runs it, by podman: the pod's
//! `hostPID`, the container's arguments, environment, ports, probes, resource limits, security
//! context and volumes become podman's flags, read from the file itself so the two cannot drift.
//! A field this translation does not know fails the test instead of being left out.
//!
//! What the translation adds is this machine's, not the pod's: runc (crun refuses the host's
//! cgroup v1/v2 hybrid), open-file and process limits within the sandbox's own, and a published
//! port for each container port (the pod network's address, which Prometheus would scrape).
use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use anyhow::{Context as _, Result, bail, ensure};
use yaml_rust2::{Yaml, YamlLoader};

/// The DaemonSet, relative to this crate.
pub const DAEMONSET: &str = "../deploy/kubernetes/daemonset.yaml";
/// Where the repository keeps the seccomp profiles a `Localhost` profile names (a node keeps
/// them under `<kubelet root>/seccomp/`).
const SECCOMP_PROFILES: &str = "../deploy/kubernetes/seccomp";
/// The flags of this machine (see the module's comment).
const MACHINE_FLAGS: &[&str] =
    &["--runtime=runc", "--ulimit=nofile=1024:1024", "--ulimit=nproc=1024:1024"];

fn crate_path(relative: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(relative)
}

/// The tracer container of the DaemonSet, as podman runs it.
#[derive(Clone, Debug)]
pub struct DaemonSetPod {
    /// The image the DaemonSet names.
    pub image: String,
    /// The container's arguments (after the image's entrypoint).
    pub args: Vec<String>,
    /// `podman run` flags, each one argument (`--name=value`).
    pub flags: Vec<String>,
    /// Where each named container port is published on the host's loopback.
    pub ports: HashMap<String, SocketAddr>,
    /// The HTTP paths of the liveness and readiness probes, with their port's name.
    pub probes: Vec<(String, String)>,
    /// `terminationGracePeriodSeconds`: how long a stop waits before SIGKILL.
    pub grace_seconds: u64,
}

impl DaemonSetPod {
    /// Reads the DaemonSet; each hostPath volume named in `host_paths` is mounted from the path
    /// given there instead (a scratch directory for the logs), `node_name` stands for the
    /// downward API's `spec.nodeName`.
    pub fn read(host_paths: &[(&str, &Path)], node_name: &str) -> Result<DaemonSetPod> {
        let path = crate_path(DAEMONSET);
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {}", path.display()))?;
        let docs = YamlLoader::load_from_str(&text).context("parsing the DaemonSet")?;
        let daemonset = docs
            .iter()
            .find(|d| d["kind"].as_str() == Some("DaemonSet"))
            .context("no DaemonSet in the file")?;
        translate(&daemonset["spec"]["template"]["spec"], host_paths, node_name)
    }

    /// The flags without those `drop` matches: a container runtime that takes something away.
    pub fn without(&self, drop: impl Fn(&str) -> bool) -> DaemonSetPod {
        let mut pod = self.clone();
        pod.flags.retain(|f| !drop(f));
        pod
    }

    /// `podman run` of this pod's container with `image` and `args` instead of its own.
    pub fn command(&self, image: &str, extra_flags: &[&str], args: &[String]) -> Command {
        let mut command = Command::new("podman");
        command.arg("run").args(MACHINE_FLAGS).args(&self.flags).args(extra_flags);
        command.arg(image).args(args);
        command
    }
}

fn str_of<'a>(y: &'a Yaml, what: &str) -> Result<&'a str> {
    y.as_str().with_context(|| format!("{what} is not a string: {y:?}"))
}

fn entries(y: &Yaml) -> Vec<(&str, &Yaml)> {
    y.as_hash()
        .map(|h| h.iter().filter_map(|(k, v)| Some((k.as_str()?, v))).collect())
        .unwrap_or_default()
}

fn translate(spec: &Yaml, host_paths: &[(&str, &Path)], node_name: &str) -> Result<DaemonSetPod> {
    let mut flags = Vec::new();
    let mut grace_seconds = 30;
    let mut volumes: HashMap<String, PathBuf> = HashMap::new();
    for (key, value) in entries(spec) {
        match key {
            "hostPID" if value.as_bool() == Some(true) => flags.push("--pid=host".into()),
            "hostPID" => {}
            // Not on the host's network: podman's bridge, as a pod's network.
            "hostNetwork" => ensure!(value.as_bool() == Some(false), "hostNetwork: {value:?}"),
            "terminationGracePeriodSeconds" => {
                grace_seconds = value.as_i64().context("grace period")?.try_into()?;
            }
            // Scheduling only; the container is read below.
            "tolerations" | "containers" => {}
            "volumes" => {
                for volume in value.as_vec().context("volumes")? {
                    let name = str_of(&volume["name"], "volume name")?;
                    let host_path = &volume["hostPath"];
                    ensure!(!host_path.is_badvalue(), "volume {name} is not a hostPath");
                    let path = match host_paths.iter().find(|(n, _)| *n == name) {
                        Some((_, path)) => path.to_path_buf(),
                        None => PathBuf::from(str_of(&host_path["path"], "hostPath path")?),
                    };
                    match host_path["type"].as_str() {
                        Some("DirectoryOrCreate") => std::fs::create_dir_all(&path)?,
                        Some("Directory") => {
                            ensure!(path.is_dir(), "{} is no directory", path.display())
                        }
                        other => bail!("hostPath type {other:?} of {name}"),
                    }
                    volumes.insert(name.to_owned(), path);
                }
            }
            other => bail!("the pod spec's {other:?} has no podman flag here: teach {}", file!()),
        }
    }
    let containers = spec["containers"].as_vec().context("containers")?;
    ensure!(containers.len() == 1, "{} containers", containers.len());
    let mut pod = DaemonSetPod {
        image: String::new(),
        args: Vec::new(),
        flags,
        ports: HashMap::new(),
        probes: Vec::new(),
        grace_seconds,
    };
    for (key, value) in entries(&containers[0]) {
        match key {
            // The test names its containers itself; the image is the one built here.
            "name" | "imagePullPolicy" => {}
            "image" => pod.image = str_of(value, "image")?.to_owned(),
            "args" => {
                for arg in value.as_vec().context("args")? {
                    pod.args.push(str_of(arg, "argument")?.to_owned());
                }
            }
            "env" => {
                for var in value.as_vec().context("env")? {
                    let name = str_of(&var["name"], "env name")?;
                    let field = var["valueFrom"]["fieldRef"]["fieldPath"].as_str();
                    let value = match (var["value"].as_str(), field) {
                        (Some(value), None) => value,
                        (None, Some("spec.nodeName")) => node_name,
                        _ => bail!("env {name}: {var:?}"),
                    };
                    pod.flags.push(format!("--env={name}={value}"));
                }
            }
            "ports" => {
                for port in value.as_vec().context("ports")? {
                    let name = str_of(&port["name"], "port name")?;
                    let number = port["containerPort"].as_i64().context("containerPort")?;
                    ensure!(port["protocol"].as_str().unwrap_or("TCP") == "TCP", "{port:?}");
                    let published = crate::http::free_port();
                    pod.flags.push(format!("--publish={published}:{number}/tcp"));
                    pod.ports.insert(name.to_owned(), published);
                }
            }
            "livenessProbe" | "readinessProbe" => {
                let get = &value["httpGet"];
                let path = str_of(&get["path"], "probe path")?;
                let port = str_of(&get["port"], "probe port (by name)")?;
                pod.probes.push((path.to_owned(), port.to_owned()));
            }
            "resources" => {
                for (kind, amounts) in entries(value) {
                    // Requests only place the pod on a node.
                    if kind == "requests" {
                        continue;
                    }
                    ensure!(kind == "limits", "resources.{kind}");
                    for (resource, amount) in entries(amounts) {
                        pod.flags.push(limit_flag(resource, str_of(amount, resource)?)?);
                    }
                }
            }
            "securityContext" => security_context(value, &mut pod.flags)?,
            "volumeMounts" => {
                for mount in value.as_vec().context("volumeMounts")? {
                    let name = str_of(&mount["name"], "mount name")?;
                    let host = volumes.get(name).with_context(|| format!("no volume {name}"))?;
                    let at = str_of(&mount["mountPath"], "mountPath")?;
                    let options =
                        if mount["readOnly"].as_bool() == Some(true) { ":ro" } else { "" };
                    for (key, _) in entries(mount) {
                        ensure!(["name", "mountPath", "readOnly"].contains(&key), "mount {key}");
                    }
                    pod.flags.push(format!("--volume={}:{at}{options}", host.display()));
                }
            }
            other => bail!("the container's {other:?} has no podman flag here: teach {}", file!()),
        }
    }
    Ok(pod)
}

/// `cpu: 500m` → `--cpus=0.5`, `memory: 128Mi` → `--memory=128m`.
fn limit_flag(resource: &str, amount: &str) -> Result<String> {
    match resource {
        "cpu" => {
            let millicores: f64 = amount.strip_suffix('m').context("cpu in millicores")?.parse()?;
            Ok(format!("--cpus={}", millicores / 1000.0))
        }
        "memory" => {
            let mebibytes = amount.strip_suffix("Mi").context("memory in Mi")?;
            Ok(format!("--memory={mebibytes}m"))
        }
        other => bail!("resource limit {other}"),
    }
}

fn security_context(context: &Yaml, flags: &mut Vec<String>) -> Result<()> {
    let user = context["runAsUser"].as_i64();
    let group = context["runAsGroup"].as_i64();
    for (key, value) in entries(context) {
        match key {
            "runAsUser" | "runAsGroup" => {}
            "privileged" if value.as_bool() == Some(true) => flags.push("--privileged".into()),
            "privileged" => {}
            "allowPrivilegeEscalation" if value.as_bool() == Some(false) => {
                flags.push("--security-opt=no-new-privileges".into())
            }
            "readOnlyRootFilesystem" if value.as_bool() == Some(true) => {
                // Kubernetes mounts no tmpfs of its own where podman's --read-only would.
                flags.extend(["--read-only".into(), "--read-only-tmpfs=false".into()]);
            }
            "capabilities" => {
                for (which, caps) in entries(value) {
                    for cap in caps.as_vec().context("capabilities")? {
                        let cap = str_of(cap, "capability")?;
                        let cap = if cap == "ALL" { cap.to_owned() } else { format!("CAP_{cap}") };
                        match which {
                            "drop" => flags.push(format!("--cap-drop={cap}")),
                            "add" => flags.push(format!("--cap-add={cap}")),
                            other => bail!("capabilities.{other}"),
                        }
                    }
                }
            }
            "seccompProfile" => match str_of(&value["type"], "seccompProfile type")? {
                "Localhost" => {
                    let name = str_of(&value["localhostProfile"], "localhostProfile")?;
                    let profile = crate_path(SECCOMP_PROFILES).join(name);
                    ensure!(profile.is_file(), "no seccomp profile {}", profile.display());
                    flags.push(format!("--security-opt=seccomp={}", profile.display()));
                }
                "Unconfined" => flags.push("--security-opt=seccomp=unconfined".into()),
                "RuntimeDefault" => {}
                other => bail!("seccompProfile type {other}"),
            },
            "appArmorProfile" => match str_of(&value["type"], "appArmorProfile type")? {
                "Unconfined" => flags.push("--security-opt=apparmor=unconfined".into()),
                "RuntimeDefault" => {}
                other => bail!("appArmorProfile type {other}"),
            },
            other => bail!("securityContext.{other} has no podman flag here: teach {}", file!()),
        }
    }
    match (user, group) {
        (Some(user), Some(group)) => flags.push(format!("--user={user}:{group}")),
        (Some(user), None) => flags.push(format!("--user={user}")),
        (None, None) => {}
        (None, Some(_)) => bail!("runAsGroup without runAsUser"),
    }
    Ok(())
}

/// A command's output, failing with everything it printed when it could not be run.
pub fn output(command: &mut Command) -> Result<Output> {
    command.output().with_context(|| format!("running {command:?}"))
}

/// Removes the named container when dropped (a failed test leaves none running).
pub struct Container(pub String);

impl Drop for Container {
    fn drop(&mut self) {
        let _ = Command::new("podman").args(["rm", "--force", "--time=5", &self.0]).output();
    }
}

/// The image `cargo xtask image` built for this version of tracer, or what to do.
pub fn local_image(daemonset_image: &str) -> Result<String> {
    let version = Command::new(crate::process::tracer_binary()).arg("--version").output()?;
    let version = String::from_utf8(version.stdout)?;
    let version = version.trim().strip_prefix("tracer ").context("tracer --version")?;
    let (repository, tag) = daemonset_image.rsplit_once(':').context("an image without a tag")?;
    ensure!(
        tag == version,
        "the DaemonSet runs {daemonset_image}, not tracer {version}: its tag is tracer's version"
    );
    let local = format!("localhost/tracer:{version}");
    ensure!(repository == "localhost/tracer", "the DaemonSet names {repository}, not {local}");
    let exists = Command::new("podman").args(["image", "exists", &local]).status()?;
    ensure!(
        exists.success(),
        "no image {local}: build it with `cargo xtask image` (`cargo xtask test` does)"
    );
    Ok(local)
}
