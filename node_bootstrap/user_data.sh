#!/bin/bash
# User-data of every cluster node: a thin shim around `python3 -m node_bootstrap run`.
#
# The stack renders this template by plain string replacement of four placeholders, each written once below
# between double at-signs: REGION, BUNDLE_S3_URI, NODE_CONFIG_JSON (multi-line JSON, inside a quoted heredoc)
# and LOG_GROUP (docs/architecture.md, section 3). It downloads and unpacks the
# bundle, writes the node config and runs the bootstrap. Any failure is logged, tags the instance
# cluster:bootstrap=failed with the reason and marks it Unhealthy so its Auto Scaling group replaces it:
# a broken node is visible, never silent.
#
# Boot must end: node_bootstrap enforces its own deadline (node config bootstrap.deadlineSeconds), and this
# shim stops waiting for it BOOTSTRAP_GRACE_S later whatever happens (a process stuck in the kernel cannot
# even be killed), then reports the failure unless node_bootstrap already did (its marker file).
#
# CLUSTER_ROOT (unset on a node) prefixes every path, so tests run this script against a fake root.
set -euo pipefail

REGION="@@REGION@@"
BUNDLE_S3_URI="@@BUNDLE_S3_URI@@"
LOG_GROUP="@@LOG_GROUP@@"

ROOT="${CLUSTER_ROOT:-}"
IMDS_URL="${CLUSTER_IMDS_URL:-http://169.254.169.254}"
BUNDLE_DIR=/opt/cluster/bundle
NODE_CONFIG=/etc/cluster/node-config.json
LOG_FILE=/var/log/cluster/bootstrap.log
EXIT_SIGNALLED=3  # node_bootstrap run: failed, and it already tagged the instance and marked it Unhealthy
SIGNALLED_MARKER=/var/lib/cluster/bootstrap-signalled  # written by node_bootstrap once it has signalled
DEFAULT_DEADLINE_S=1200
BOOTSTRAP_GRACE_S="${CLUSTER_BOOTSTRAP_GRACE_S:-120}"
POLL_S=0.5

STAGE="start"
BOOTSTRAP_SIGNALLED=0

log() {
  local line
  line="$(date -u +%Y-%m-%dT%H:%M:%SZ) user-data: $*"
  echo "$line"
  echo "$line" >>"$ROOT$LOG_FILE" || true
}

imds() {  # IMDSv2: a session token first, then the metadata path
  local token
  token="$(curl -sSf --retry 3 -X PUT "$IMDS_URL/latest/api/token" \
    -H "X-aws-ec2-metadata-token-ttl-seconds: 300")" || return 1
  curl -sSf --retry 3 -H "X-aws-ec2-metadata-token: $token" "$IMDS_URL/latest/meta-data/$1"
}

retry() {  # retry ATTEMPTS COMMAND...: exponential backoff from 2 s
  local attempts="$1" attempt=1 delay_s=2
  shift
  until "$@"; do
    if [ "$attempt" -ge "$attempts" ]; then
      return 1
    fi
    log "attempt $attempt of $attempts failed: $*; retrying in ${delay_s} s"
    sleep "$delay_s"
    attempt=$((attempt + 1))
    delay_s=$((delay_s * 2))
  done
}

signal_failure() {  # tag failed with the reason and mark Unhealthy (the same contract as node_bootstrap)
  local reason="$1" instance_id
  reason="${reason//\\//}"
  reason="${reason//\"/\'}"
  reason="${reason:0:256}"
  instance_id="$(imds instance-id)" || { log "cannot read the instance id from IMDS"; return 1; }
  aws ec2 create-tags --region "$REGION" --resources "$instance_id" --tags \
    "[{\"Key\":\"cluster:bootstrap\",\"Value\":\"failed\"},{\"Key\":\"cluster:bootstrap-reason\",\"Value\":\"$reason\"}]" \
    || { log "aws ec2 create-tags failed"; return 1; }
  aws autoscaling set-instance-health --region "$REGION" --instance-id "$instance_id" \
    --health-status Unhealthy --no-should-respect-grace-period \
    || { log "aws autoscaling set-instance-health failed"; return 1; }
  log "tagged $instance_id cluster:bootstrap=failed and marked it Unhealthy"
}

on_exit() {
  local rc=$?
  trap - EXIT ERR
  if [ "$rc" -eq 0 ]; then
    log "bootstrap finished"
    exit 0
  fi
  if [ "$BOOTSTRAP_SIGNALLED" -eq 1 ]; then
    log "FAILED in node_bootstrap (exit $rc); it already tagged the instance failed and marked it Unhealthy"
    exit "$rc"
  fi
  log "FAILED at stage '$STAGE' (exit $rc)"
  signal_failure "user-data failed at stage '$STAGE' (exit $rc); see $LOG_FILE" \
    || log "could not mark the instance failed: an operator must replace it"
  exit "$rc"
}
trap on_exit EXIT
trap 'log "command failed (exit $?) at line $LINENO: $BASH_COMMAND"' ERR

mkdir -p "$ROOT/var/log/cluster" "$ROOT/etc/cluster" "$ROOT/opt/cluster"

STAGE="tag running"
INSTANCE_ID="$(imds instance-id)"
log "bootstrapping $INSTANCE_ID in $REGION; log: $LOG_FILE, CloudWatch $LOG_GROUP stream $INSTANCE_ID/bootstrap"
# Informational only: a node that cannot set this tag is still a good node (the ready/failed tags decide).
aws ec2 create-tags --region "$REGION" --resources "$INSTANCE_ID" --tags Key=cluster:bootstrap,Value=running \
  || log "could not tag $INSTANCE_ID cluster:bootstrap=running (not fatal); continuing"

STAGE="download bundle"
WORK_DIR="$(mktemp -d)"
retry 5 aws s3 cp --region "$REGION" --only-show-errors "$BUNDLE_S3_URI" "$WORK_DIR/bundle.zip"

STAGE="unpack bundle"
# python3 -m zipfile, because unzip is not on every AMI; unpack aside, then swap, so a rerun is clean.
rm -rf "$ROOT$BUNDLE_DIR.new"
python3 -m zipfile -e "$WORK_DIR/bundle.zip" "$ROOT$BUNDLE_DIR.new"
rm -rf "$ROOT$BUNDLE_DIR"
mv "$ROOT$BUNDLE_DIR.new" "$ROOT$BUNDLE_DIR"
rm -rf "$WORK_DIR"

STAGE="write node config"
cat >"$ROOT$NODE_CONFIG.new" <<'NODE_CONFIG_EOF'
@@NODE_CONFIG_JSON@@
NODE_CONFIG_EOF
mv "$ROOT$NODE_CONFIG.new" "$ROOT$NODE_CONFIG"

STAGE="node_bootstrap run"
rm -f "$ROOT$SIGNALLED_MARKER"
DEADLINE_S="$(python3 -c 'import json, sys; print(int(json.load(open(sys.argv[1]))["bootstrap"]["deadlineSeconds"]))' \
  "$ROOT$NODE_CONFIG" 2>/dev/null || echo "$DEFAULT_DEADLINE_S")"
LIMIT_S=$((DEADLINE_S + BOOTSTRAP_GRACE_S))
set +e
if [ -n "$ROOT" ]; then
  PYTHONPATH="$ROOT$BUNDLE_DIR" python3 -m node_bootstrap run --config "$NODE_CONFIG" --root "$ROOT" &
else
  PYTHONPATH="$BUNDLE_DIR" python3 -m node_bootstrap run --config "$NODE_CONFIG" &
fi
BOOTSTRAP_PID=$!
START_S=$SECONDS
while kill -0 "$BOOTSTRAP_PID" 2>/dev/null && [ $((SECONDS - START_S)) -lt "$LIMIT_S" ]; do
  sleep "$POLL_S"
done
if kill -0 "$BOOTSTRAP_PID" 2>/dev/null; then
  # Past its own deadline and the grace: kill it, and do not wait for it (it may never die).
  kill -KILL "$BOOTSTRAP_PID" 2>/dev/null
  log "node_bootstrap (pid $BOOTSTRAP_PID) still ran ${LIMIT_S} s after it started: killed and abandoned"
  rc=124
else
  wait "$BOOTSTRAP_PID"
  rc=$?
fi
set -e
if [ "$rc" -eq "$EXIT_SIGNALLED" ] || [ -e "$ROOT$SIGNALLED_MARKER" ]; then
  BOOTSTRAP_SIGNALLED=1
fi
if [ "$rc" -ne 0 ]; then
  STAGE="node_bootstrap run (exit $rc)"
  exit "$rc"
fi
