#!/usr/bin/env python3
"""Pushes a packaged chart to an OCI registry as `helm push` does, for a helm without `push`.

usage: oci-push-chart.py CHART.tgz oci://HOST[:PORT]/PATH [--plain-http]

The artifact is the one Helm's registry client writes (helm.sh/helm/v4/pkg/registry): an OCI
image manifest whose config is the chart's metadata as JSON
(application/vnd.cncf.helm.config.v1+json) and whose one layer is the .tgz
(application/vnd.cncf.helm.chart.content.v1.tar+gzip), tagged with the chart's version ("+"
written "_"), at <PATH>/<chart name>. Blobs go up by the distribution API's monolithic upload
(POST, then PUT ?digest=). Prints the manifest's digest.
"""

import hashlib
import json
import sys
import tarfile
import urllib.parse
import urllib.request

CONFIG = "application/vnd.cncf.helm.config.v1+json"
LAYER = "application/vnd.cncf.helm.chart.content.v1.tar+gzip"
MANIFEST = "application/vnd.oci.image.manifest.v1+json"


def chart_metadata(tgz):
    """Chart.yaml's top-level scalars (name, version, appVersion, ...), as helm's config."""
    with tarfile.open(tgz) as tar:
        member = next(m for m in tar.getmembers() if m.name.count("/") == 1 and m.name.endswith("/Chart.yaml"))
        text = tar.extractfile(member).read().decode()
    meta = {}
    for line in text.splitlines():
        if line and not line[0].isspace() and not line.startswith("#") and ":" in line:
            key, _, value = line.partition(":")
            value = value.strip().strip('"')
            if value and value not in (">-", "|", ">"):
                meta[key] = value
    for key in ("name", "version", "apiVersion"):
        if key not in meta:
            sys.exit(f"error: {tgz}: Chart.yaml has no {key}")
    return meta


def request(method, url, data=None, content_type=None):
    req = urllib.request.Request(url, data=data, method=method)
    if content_type:
        req.add_header("Content-Type", content_type)
    with urllib.request.urlopen(req) as resp:
        return resp.status, resp.headers


def push_blob(base, repo, data):
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    _, headers = request("POST", f"{base}/v2/{repo}/blobs/uploads/")
    location = urllib.parse.urljoin(f"{base}/", headers["Location"])
    sep = "&" if "?" in location else "?"
    request("PUT", f"{location}{sep}digest={digest}", data, "application/octet-stream")
    return {"digest": digest, "size": len(data)}


def main(argv):
    if len(argv) not in (2, 3) or not argv[1].startswith("oci://") or argv[2:] not in ([], ["--plain-http"]):
        sys.exit(__doc__.split("\n\n")[1])
    tgz, ref = argv[0], argv[1][len("oci://") :].rstrip("/")
    scheme = "http" if argv[2:] else "https"
    host, _, path = ref.partition("/")
    meta = chart_metadata(tgz)
    repo = f"{path}/{meta['name']}" if path else meta["name"]
    base = f"{scheme}://{host}"
    with open(tgz, "rb") as f:
        chart = f.read()
    config = push_blob(base, repo, json.dumps(meta, separators=(",", ":")).encode())
    layer = push_blob(base, repo, chart)
    manifest = {
        "schemaVersion": 2,
        "mediaType": MANIFEST,
        "config": {"mediaType": CONFIG, **config},
        "layers": [{"mediaType": LAYER, **layer}],
        "annotations": {
            "org.opencontainers.image.title": meta["name"],
            "org.opencontainers.image.version": meta["version"],
        },
    }
    body = json.dumps(manifest, separators=(",", ":")).encode()
    tag = meta["version"].replace("+", "_")
    request("PUT", f"{base}/v2/{repo}/manifests/{tag}", body, MANIFEST)
    print(f"Pushed: {host}/{repo}:{tag}\nDigest: sha256:{hashlib.sha256(body).hexdigest()}")


if __name__ == "__main__":
    main(sys.argv[1:])
