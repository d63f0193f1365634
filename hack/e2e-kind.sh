#!/usr/bin/env bash
# The reptables scenario on a real Kubernetes cluster (kind): image, Helm chart, operator, engines,
# replicated table, rows on every replica, tracker failover.
#
# NOT RUN HERE: the project's development and CI machines have no Docker engine, so this script has
# only been checked with `bash -n` and shellcheck (its steps after `helm install` were rehearsed
# against the API emulator and local engines). Run it on a machine with docker, kind, kubectl and
# helm:
#
#   hack/e2e-kind.sh                  # creates kind cluster "reptables-e2e", deletes it at the end
#   KEEP_CLUSTER=1 hack/e2e-kind.sh   # keep the cluster (and everything in it) for a look
#
# Steps: kind cluster -> docker build -> kind load docker-image -> helm install (operator + engines
# primary, remote-0, remote-1, each with its TableCluster) -> examples/ ReplicatedTable, TableReplicas
# and TableCollocation (the chart's TableClusters replace examples/tableclusters.yaml, whose
# endpoints are local ports) -> kubectl wait Ready -> a Job writes rows with the Python client and
# checks that every replica has them -> the sync replica's engine is stopped and the tracker must
# move the sync replica to the other replica -> cleanup (trap).
set -euo pipefail

CLUSTER="${CLUSTER:-reptables-e2e}"
NAMESPACE="${NAMESPACE:-reptables-system}"
RELEASE="${RELEASE:-reptables}"
# the chart's resource-name prefix: the release name, or <release>-reptables when it lacks "reptables"
case "$RELEASE" in
  *reptables*) FULLNAME="$RELEASE" ;;
  *) FULLNAME="$RELEASE-reptables" ;;
esac
IMAGE="${IMAGE:-reptables:e2e}"
TIMEOUT="${TIMEOUT:-300s}"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CREATED=0
WORK="$(mktemp -d)"

log() { printf '\n==> %s\n' "$*" >&2; }
die() { printf 'e2e-kind: error: %s\n' "$*" >&2; exit 1; }
need() {
  command -v "$1" >/dev/null 2>&1 || die "'$1' is required but not found on PATH (install: $2)"
}

need docker "https://docs.docker.com/engine/install/"
need kind "https://kind.sigs.k8s.io/docs/user/quick-start/#installation"
need kubectl "https://kubernetes.io/docs/tasks/tools/"
need helm "https://helm.sh/docs/intro/install/"
docker info >/dev/null 2>&1 || die "docker is installed but the Docker engine does not answer (is the daemon running?)"

diagnostics() {
  log "diagnostics"
  kubectl get tableclusters -o wide || true
  kubectl -n "$NAMESPACE" get reptables,statefulsets,pods,pvc,jobs -o wide || true
  kubectl -n "$NAMESPACE" describe replicatedtable orders || true
  kubectl -n "$NAMESPACE" get events --sort-by=.lastTimestamp | tail -n 40 || true
  kubectl -n "$NAMESPACE" logs "deployment/${FULLNAME}-operator" --tail=200 || true
  kubectl -n "$NAMESPACE" logs job/e2e-rows --tail=100 || true
}

cleanup() {
  local rc=$?
  trap - EXIT
  if [ "$rc" -ne 0 ] && [ "$CREATED" = 1 ]; then
    diagnostics
  fi
  if [ "$CREATED" = 1 ]; then
    if [ "${KEEP_CLUSTER:-0}" = 1 ]; then
      log "keeping kind cluster '$CLUSTER' (KEEP_CLUSTER=1); delete it with: kind delete cluster --name $CLUSTER"
    else
      log "deleting kind cluster '$CLUSTER'"
      kind delete cluster --name "$CLUSTER" >/dev/null 2>&1 || true
    fi
  fi
  rm -rf "$WORK"
  if [ "$rc" -eq 0 ]; then
    printf '\ne2e-kind: PASSED\n' >&2
  else
    printf '\ne2e-kind: FAILED (exit %s)\n' "$rc" >&2
  fi
  exit "$rc"
}
trap cleanup EXIT

if kind get clusters 2>/dev/null | grep -qx "$CLUSTER"; then
  die "a kind cluster named '$CLUSTER' already exists; delete it (kind delete cluster --name $CLUSTER) or set CLUSTER"
fi

log "creating kind cluster '$CLUSTER'"
kind create cluster --name "$CLUSTER" --wait 120s
CREATED=1
kubectl config use-context "kind-$CLUSTER" >/dev/null

log "building image $IMAGE"
docker build -t "$IMAGE" "$ROOT"
log "loading $IMAGE into the kind cluster"
kind load docker-image "$IMAGE" --name "$CLUSTER"

log "installing the chart (release $RELEASE, namespace $NAMESPACE) with three engines"
cat >"$WORK/values.yaml" <<VALUES
image:
  repository: "${IMAGE%:*}"
  tag: "${IMAGE##*:}"
  pullPolicy: Never
operator:
  replicas: 1
  statusRefreshSeconds: 2
engines:
  - {name: primary, clusterId: 0, storage: {size: 1Gi}}
  - {name: remote-0, clusterId: 1, storage: {size: 1Gi}}
  - {name: remote-1, clusterId: 2, storage: {size: 1Gi}}
engineDefaults:
  resources:
    requests: {cpu: 50m, memory: 128Mi}
    limits: {memory: 1Gi}
# the chart's NetworkPolicy admits only the operator and the engines: let the test Job in too
networkPolicy:
  clients:
    - podSelector: {matchLabels: {job-name: e2e-rows}}
VALUES
helm upgrade --install "$RELEASE" "$ROOT/charts/reptables" --namespace "$NAMESPACE" --create-namespace \
  --values "$WORK/values.yaml" --wait --timeout "$TIMEOUT"

log "waiting for the TableClusters"
kubectl wait --for=condition=Ready tablecluster/primary tablecluster/remote-0 tablecluster/remote-1 \
  --timeout "$TIMEOUT"

log "applying examples/ (ReplicatedTable, TableReplicas, TableCollocation) in $NAMESPACE"
kubectl -n "$NAMESPACE" apply -f "$ROOT/examples/replicatedtable.yaml" -f "$ROOT/examples/tablereplicas.yaml" \
  -f "$ROOT/examples/tablecollocation.yaml"
kubectl -n "$NAMESPACE" wait --for=condition=Ready replicatedtable/orders tablereplica/orders-remote-0 \
  tablereplica/orders-remote-1 tablecollocation/shop --timeout "$TIMEOUT"
kubectl -n "$NAMESPACE" wait --for=condition=Writable replicatedtable/orders --timeout "$TIMEOUT"
kubectl -n "$NAMESPACE" get reptables -o wide

log "writing rows on primary and reading them back from every replica (Job e2e-rows)"
cat >"$WORK/job.yaml" <<JOB
apiVersion: batch/v1
kind: Job
metadata:
  name: e2e-rows
spec:
  backoffLimit: 0
  activeDeadlineSeconds: 300
  template:
    spec:
      restartPolicy: Never
      automountServiceAccountToken: false
      securityContext:
        runAsNonRoot: true
        runAsUser: 10001
        seccompProfile: {type: RuntimeDefault}
      containers:
        - name: rows
          image: "$IMAGE"
          imagePullPolicy: Never
          securityContext:
            allowPrivilegeEscalation: false
            readOnlyRootFilesystem: true
            capabilities: {drop: [ALL]}
          env:
            - {name: HOME, value: /tmp}
$(for engine in primary remote-0 remote-1; do
    var="$(printf '%s' "$engine" | tr 'a-z-' 'A-Z_')"
    printf '            - {name: %s_URL, value: "http://%s-%s.%s.svc:9012"}\n' "$var" "$FULLNAME" "$engine" "$NAMESPACE"
    printf '            - name: %s_TOKEN\n' "$var"
    printf '              valueFrom: {secretKeyRef: {name: %s-%s-token, key: token}}\n' "$FULLNAME" "$engine"
  done)
          volumeMounts:
            - {name: tmp, mountPath: /tmp}
          command: ["python", "-c"]
          args:
            - |
              import os, time
              from reptables.engine.client import Client
              def client(name):
                  return Client(os.environ[name + "_URL"], os.environ[name + "_TOKEN"], timeout=10)
              path = "//home/shop/orders"
              rows = [{"order_id": i, "customer": f"c{i}", "amount": i / 2, "status": "new"}
                      for i in list(range(1, 51)) + list(range(1000001, 1000051))]
              for attempt in range(10):  # the tracker may be moving the sync replica right now
                  try:
                      client("PRIMARY").insert_rows(path, rows)
                      break
                  except Exception as exc:
                      print("insert failed, retrying:", exc, flush=True)
                      time.sleep(3)
              else:
                  raise SystemExit("could not insert the rows on primary")
              print("inserted", len(rows), "rows on primary", flush=True)
              for name in ("REMOTE_0", "REMOTE_1"):
                  deadline = time.monotonic() + 120
                  while True:
                      found = client(name).select_rows(f"order_id from [{path}]")
                      if len(found) == len(rows):
                          print(name, "has all", len(rows), "rows", flush=True)
                          break
                      if time.monotonic() > deadline:
                          raise SystemExit(f"{name} has {len(found)} of {len(rows)} rows after 120 s")
                      time.sleep(1)
      volumes:
        - {name: tmp, emptyDir: {}}
JOB
kubectl -n "$NAMESPACE" apply -f "$WORK/job.yaml"
deadline=$((SECONDS + 300))
while :; do
  succeeded="$(kubectl -n "$NAMESPACE" get job e2e-rows -o jsonpath='{.status.succeeded}')"
  failed="$(kubectl -n "$NAMESPACE" get job e2e-rows -o jsonpath='{.status.failed}')"
  if [ "${succeeded:-0}" -ge 1 ]; then break; fi
  if [ "${failed:-0}" -ge 1 ]; then die "Job e2e-rows failed: rows did not reach every replica"; fi
  if [ "$SECONDS" -ge "$deadline" ]; then die "Job e2e-rows did not finish in 300 s"; fi
  sleep 3
done
kubectl -n "$NAMESPACE" logs job/e2e-rows

log "tracker failover: stopping the engine of the current sync replica"
sync="$(kubectl -n "$NAMESPACE" get replicatedtable orders -o jsonpath='{.status.syncReplicas[0]}')"
case "$sync" in
  orders-remote-0) down=remote-0; other=orders-remote-1 ;;
  orders-remote-1) down=remote-1; other=orders-remote-0 ;;
  *) die "expected one sync replica (orders-remote-0 or orders-remote-1), got '$sync'" ;;
esac
log "sync replica is $sync: scaling statefulset ${FULLNAME}-$down to 0, expecting $other to become sync"
kubectl -n "$NAMESPACE" scale statefulset "${FULLNAME}-$down" --replicas=0
kubectl -n "$NAMESPACE" wait --for=jsonpath='{.status.syncReplicas[0]}'="$other" replicatedtable/orders \
  --timeout "$TIMEOUT"
kubectl -n "$NAMESPACE" get reptables -o wide
kubectl -n "$NAMESPACE" scale statefulset "${FULLNAME}-$down" --replicas=1
kubectl -n "$NAMESPACE" rollout status statefulset "${FULLNAME}-$down" --timeout "$TIMEOUT"
kubectl wait --for=condition=Ready "tablecluster/$down" --timeout "$TIMEOUT"

log "all checks passed"
