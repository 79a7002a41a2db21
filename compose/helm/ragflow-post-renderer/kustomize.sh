#!/bin/sh
# Helm hands the rendered manifests on stdin and reads the patched ones on stdout. kustomize
# reads files only: the manifests go to a temporary directory beside this plugin's
# kustomization and patch. `kubectl kustomize` when kubectl is on PATH, else `kustomize build`.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cat > "$work/rendered.yaml"
cp "$here/kustomization.yaml" "$here/ragflow-mq.patch.yaml" "$work/"
if command -v kubectl >/dev/null 2>&1; then
  exec kubectl kustomize "$work"
fi
exec kustomize build "$work"
