#!/usr/bin/env bash
# Copies deploy/ to DIR with the image pinned: the `images:` entry for `wdp` in
# DIR/kustomization.yaml gets newName IMAGE and newTag VERSION (what `kustomize edit set image
# wdp=IMAGE:VERSION` writes), so `kubectl apply -k DIR` installs exactly that release. Run by
# scripts/release.sh for dist/deploy/; tests/tests/release.rs renders its output.
#
#   scripts/pin-deploy.sh DIR IMAGE VERSION
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
[[ $# -eq 3 ]] || { echo "usage: scripts/pin-deploy.sh DIR IMAGE VERSION" >&2; exit 1; }
dir=$1 image=$2 version=$3
[[ ! -e $dir ]] || { echo "pin-deploy.sh: $dir exists already" >&2; exit 1; }
cp -r "$root/deploy" "$dir"
python3 - "$dir/kustomization.yaml" "$image" "$version" <<'PY'
import re, sys
path, image, version = sys.argv[1:]
text = open(path).read()
entry = re.compile(r"^images:\n  - name: wdp\n(    new(Name|Tag): .*\n)*", re.M)
if len(entry.findall(text)) != 1:
    sys.exit(f"pin-deploy.sh: {path}: no single `images:` entry for wdp to pin")
text = entry.sub(f"images:\n  - name: wdp\n    newName: {image}\n    newTag: {version}\n", text)
open(path, "w").write(text)
PY
