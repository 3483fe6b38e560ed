"""What a real node needs on the machine, kept inside the real-node cluster's mount namespace
(``tests.support.realnode``): the paths it writes bound to folders under the cluster's state folder, the
configuration of containerd, CNI, the kubelet and CoreDNS, and the teardown that leaves nothing behind
(pod processes, cgroups, mounts, the mount points it had to create).

Runs only inside ``unshare --mount --propagation private``: a bind mount made here is seen by this
namespace alone, and goes away with it.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

CONTAINERD_SOCK = "/run/containerd/containerd.sock"
# Where a kubelet, containerd and the CNI plugins write, whatever their flags say (containerd's shims put
# sockets under /run/containerd even with its state moved; the CNI cache lives in /var/lib/cni).
NODE_PATHS = (
    "/var/lib/kubelet",
    "/var/lib/cni",
    "/var/log/pods",
    "/var/log/containers",
    "/run/containerd",
    "/run/netns",
)
CGROUP_ROOT = Path("/sys/fs/cgroup")
POD_CGROUP = "kubepods"


def _mount(*args: str) -> None:
    r = subprocess.run(["mount", *args], capture_output=True, text=True)
    if r.returncode != 0:
        raise OSError(f"mount {' '.join(args)} failed: {r.stderr.strip()}")


def enter(state: Path, sysctls: dict[str, str]) -> None:
    """Bind a folder of ``state`` over each of ``NODE_PATHS``, and a file holding each value of
    ``sysctls`` over its ``/proc/sys`` file. Mount points missing on the host are made, and recorded in
    ``state/created`` so that ``leave`` removes them again."""
    with contextlib.suppress(OSError):  # the parent is the command that ran `unshare` (or gone)
        if os.readlink("/proc/self/ns/mnt") == os.readlink(f"/proc/{os.getppid()}/ns/mnt"):
            raise RuntimeError("nodefs.enter must run in a private mount namespace (unshare --mount)")
    created = state / "created"
    for path in NODE_PATHS:
        target = Path(path)
        if not target.exists():
            missing = [str(p) for p in (target, *target.parents) if not p.exists()]
            with created.open("a") as f:  # before making them: a failure halfway still removes them
                f.write("".join(m + "\n" for m in missing))
            target.mkdir(parents=True)
        source = state / "node-root" / path.strip("/")
        source.mkdir(parents=True, exist_ok=True)
        _mount("--bind", str(source), path)
    for key, value in sysctls.items():
        holder = state / "sysctl" / key.replace("/", ".")
        holder.parent.mkdir(parents=True, exist_ok=True)
        holder.write_text(value + "\n")
        _mount("--bind", str(holder), f"/proc/sys/{key}")


def leave(state: Path) -> None:
    """Undo ``enter``: unmount, then remove the mount points it had to create (deepest first)."""
    mounts = Path("/proc/self/mounts").read_text().splitlines()
    targets = [m.split()[1] for m in mounts]
    for target in reversed(targets):
        if target.startswith(("/proc/sys/", *NODE_PATHS)):
            subprocess.run(["umount", "-l", target], capture_output=True)
    created = (state / "created").read_text().split() if (state / "created").exists() else []
    for path in sorted(created, key=len, reverse=True):
        # Made by enter, so whatever is in one now was written by the node: removed with it.
        shutil.rmtree(path, ignore_errors=True)


def _pod_pids() -> set[int]:
    pids: set[int] = set()
    for hierarchy in CGROUP_ROOT.iterdir():
        # os.walk, not rglob: pod cgroups go away while this walks them (a removed one is skipped).
        for folder, _, files in os.walk(hierarchy / POD_CGROUP):
            if "cgroup.procs" in files:
                with contextlib.suppress(OSError, ValueError):
                    pids.update(int(p) for p in Path(folder, "cgroup.procs").read_text().split())
    return pids


def pod_processes() -> set[int]:
    """The processes in pod cgroups on this machine: none unless a real node runs (or ran and leaked)."""
    return _pod_pids()


def _namespace_mates() -> set[int]:
    mine = os.readlink("/proc/self/ns/mnt")
    mates = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            with contextlib.suppress(OSError):
                if os.readlink(entry / "ns" / "mnt") == mine:
                    mates.add(int(entry.name))
    return mates


def _kill_until_gone(find: Callable[[], set[int]], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while (pids := find()) and time.monotonic() < deadline:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            while os.waitpid(-1, os.WNOHANG)[0] > 0:
                pass
        time.sleep(0.1)


def kill_pods(timeout: float) -> None:
    """Every process of every pod (the pod cgroups hold them all, whatever namespaces they have)."""
    _kill_until_gone(_pod_pids, timeout)


def kill_namespace_mates(timeout: float) -> None:
    """Every other process of this mount namespace: containerd's shims, shells entered from outside."""
    _kill_until_gone(_namespace_mates, timeout)


def remove_cgroups(timeout: float = 15.0) -> None:
    """The pod cgroups the kubelet made in every hierarchy, deepest first; a cgroup whose last killed
    process has not exited yet is busy, so this tries again until ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        roots = [h / POD_CGROUP for h in CGROUP_ROOT.iterdir() if (h / POD_CGROUP).is_dir()]
        for root in roots:
            for folder, _, _ in os.walk(root, topdown=False):
                with contextlib.suppress(OSError):
                    os.rmdir(folder)
        if not any(r.exists() for r in roots) or time.monotonic() > deadline:
            return
        time.sleep(0.2)


def leftovers() -> list[str]:
    """What a teardown must not leave on the host (seen from the host's namespaces): pod cgroups, files
    in the node's paths, containerd shims."""
    found = [str(h / POD_CGROUP) for h in CGROUP_ROOT.iterdir() if (h / POD_CGROUP).exists()]
    for path in NODE_PATHS:
        with contextlib.suppress(OSError):
            if any(Path(path).iterdir()):
                found.append(path)
    for entry in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            if (
                entry.name.isdigit()
                and b"containerd-shim" in (entry / "cmdline").read_bytes().split(b"\0")[0]
            ):
                found.append(f"process {entry.name} (containerd-shim)")
    return found


def containerd_config(state: Path, pause_image: str) -> str:
    cni = state / "node" / "cni"
    return f"""version = 2
root = "{state / "containerd"}"
state = "/run/containerd"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.tracing.processor.v1.otlp"]
[grpc]
  address = "{CONTAINERD_SOCK}"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{pause_image}"
  restrict_oom_score_adj = true
  disable_apparmor = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "{cni}"
"""


def cni_config(subnet: str, gateway: str, state: Path) -> str:
    bridge = {
        "type": "bridge",
        "bridge": "cni0",
        "isGateway": True,
        "ipMasq": False,
        "hairpinMode": True,
        "ipam": {
            "type": "host-local",
            "ranges": [[{"subnet": subnet, "gateway": gateway}]],
            "routes": [{"dst": "0.0.0.0/0"}],
            "dataDir": str(state / "cni-ipam"),
        },
    }
    portmap = {"type": "portmap", "capabilities": {"portMappings": True}}
    return json.dumps({"cniVersion": "0.4.0", "name": "dynamo-real", "plugins": [bridge, portmap]}, indent=2)


def kubelet_config(pki: Path, node_ip: str, resolv_conf: Path) -> dict[str, object]:
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": str(pki / "ca.crt")},
        },
        "authorization": {"mode": "Webhook"},
        "address": node_ip,
        "healthzBindAddress": "127.0.0.1",
        "cgroupDriver": "cgroupfs",
        "failCgroupV1": False,  # this machine's cgroups are v1 (1.35+ refuses them by default)
        "failSwapOn": False,
        "containerRuntimeEndpoint": f"unix://{CONTAINERD_SOCK}",
        "clusterDNS": [node_ip],
        "clusterDomain": "cluster.local",
        "resolvConf": str(resolv_conf),
        # Never collect the images imported here (no registry could give them back), nor evict on a
        # busy disk: a test cluster lives minutes.
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "evictionHard": {"memory.available": "100Mi", "nodefs.available": "1%", "imagefs.available": "1%"},
        "serializeImagePulls": False,
        "nodeStatusUpdateFrequency": "4s",
        "shutdownGracePeriod": "0s",
        "maxPods": 110,
    }


def corefile(kubeconfig: Path) -> str:
    return f""".:53 {{
    errors
    health 127.0.0.1:8080
    ready 127.0.0.1:8181
    kubernetes cluster.local in-addr.arpa ip6.arpa {{
        kubeconfig {kubeconfig}
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
        ttl 5
    }}
    cache 5
}}
"""
