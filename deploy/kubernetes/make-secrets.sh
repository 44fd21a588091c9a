#!/bin/sh
# Make the two Secrets the bundle mounts, from new keys written under DIR (keep DIR private):
#   dsi-curve-keys  a CURVE key set (`dsi keys create --out DIR/curve`), for [security] of the ConfigMap
#   dsi-api-keys    api-keys.toml with one new gateway API key, for api_keys_file of the entrypoint
# Run it once, after `kubectl apply -f deploy/kubernetes/namespace.yaml` and before
# `kubectl apply -k deploy/kubernetes/`:
#   deploy/kubernetes/make-secrets.sh ~/dsi-secrets
# Environment: NAMESPACE (default dsi), KUBECTL (default kubectl), DSI (default dsi).
set -eu
if [ $# -ne 1 ]; then
    echo "usage: $0 DIR  (a new or empty folder for the key files)" >&2
    exit 2
fi
dir=$1
namespace=${NAMESPACE:-dsi}
kubectl=${KUBECTL:-kubectl}
dsi=${DSI:-dsi}
umask 077

if [ -e "$dir/api-keys.toml" ]; then
    echo "$0: $dir/api-keys.toml exists already; use a new folder" >&2
    exit 1
fi
"$dsi" keys create --out "$dir/curve" >/dev/null
key="sk-dsi-$(od -An -N32 -tx1 /dev/urandom | tr -d ' \n')"
cat >"$dir/api-keys.toml" <<TOML
# Gateway API keys (see dsi.roles.entrypoint.auth): send as "Authorization: Bearer KEY".
[[keys]]
key = "$key"
name = "default"
TOML

# Secret keys are flat names; the StatefulSets' volume items put each file back at its path.
"$kubectl" -n "$namespace" create secret generic dsi-curve-keys \
    --from-file=server.key="$dir/curve/server.key" \
    --from-file=server.key_secret="$dir/curve/server.key_secret" \
    --from-file=cluster.key_secret="$dir/curve/clients/cluster.key_secret" \
    --from-file=authorized-cluster.key="$dir/curve/authorized/cluster.key"
"$kubectl" -n "$namespace" create secret generic dsi-api-keys \
    --from-file=api-keys.toml="$dir/api-keys.toml"
echo "The gateway's API key is in $dir/api-keys.toml (name \"default\"); add more [[keys]] there and"
echo "replace the Secret to change them (kubectl -n $namespace create secret generic dsi-api-keys"
echo "--from-file=api-keys.toml=$dir/api-keys.toml --dry-run=client -o yaml | kubectl apply -f -)."
