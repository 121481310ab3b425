# syntax=docker/dockerfile:1
# zb's container images (docs/deploy-kubernetes.md, Images), one target per
# role, all from one build:
#   docker build --target coordinator -t registry.example.com/zb/zb-coordinator:0.1.0 .
#   docker build --target worker      -t registry.example.com/zb/zb-worker:0.1.0 .
#   docker build --target zbctl       -t registry.example.com/zb/zbctl:0.1.0 .
# Without --target the last stage, coordinator, is built. Every image holds
# all three binaries in /usr/local/bin and runs as the non-root user zb,
# UID/GID 10001 (the manifests' runAsUser in deploy/k8s). The build has no
# CUDA (ZB_CUDA=OFF): its workers offer the sim and cpu backends; a GPU
# worker image needs the CUDA build (see the docs).

# --- build: the Debian 12 toolchain and -dev packages ----------------------
FROM debian:12 AS build
# The package list lives in scripts/install-deps.sh alone (as root it runs
# apt-get); copied first so this layer is cached until the list changes.
COPY scripts/install-deps.sh /src/scripts/install-deps.sh
RUN /src/scripts/install-deps.sh && rm -rf /var/lib/apt/lists/*
COPY . /src
WORKDIR /src
# JOBS: parallel compile jobs. ZB_WERROR: warnings are errors in development
# builds; off here, because gcc 12 at -O3 (the release preset) reports a
# maybe-uninitialized false positive in common/zb_yaml.c.
ARG JOBS=2
ARG ZB_WERROR=OFF
RUN cmake --preset release -DZB_CUDA=OFF -DZB_WITH_SERVICE=ON -DZB_BUILD_TESTS=OFF -DZB_BUILD_BENCH=OFF \
      -DZB_WERROR=${ZB_WERROR} \
 && cmake --build --preset release -j "${JOBS}" --target zb-coordinator zb-worker zbctl \
 && mkdir -p /out \
 && install -m 0755 -s build/release/daemon/zb-coordinator build/release/worker/zb-worker \
      build/release/client/zbctl /out/

# --- runtime: debian:12-slim with the shared libraries the binaries need ---
# (readelf -d: zb-coordinator needs libsqlite3, libuv, libprotobuf-c,
# libgrpc/libgpr, libyaml, libmicrohttpd; zb-worker libprotobuf-c,
# libgrpc/libgpr, libcrypto, libopenblas; zbctl libprotobuf-c, libgrpc/libgpr,
# libyaml. tests/deploy/test_k8s.py checks this list against the binaries.)
FROM debian:12-slim AS runtime
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      libgrpc29 libprotobuf-c1 libuv1 libyaml-0-2 libsqlite3-0 libmicrohttpd12 libopenblas0-pthread libssl3 \
 && rm -rf /var/lib/apt/lists/*
# The user the manifests run as; /var/lib/zb (the coordinator's data_dir)
# and /data (the workers' --path-root) for runs outside Kubernetes, where
# no volume is mounted there. The workers' default training text must be
# in the image: its directory is a --path-root in the manifests.
RUN groupadd --system --gid 10001 zb \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin zb \
 && install -d -o 10001 -g 10001 -m 0750 /var/lib/zb /data \
 && test -r /usr/share/common-licenses/GPL-3
COPY --from=build /out/ /usr/local/bin/
USER 10001:10001
WORKDIR /var/lib/zb

# --- one target per role: what ENTRYPOINT runs ----------------------------
FROM runtime AS worker
ENTRYPOINT ["/usr/local/bin/zb-worker"]

FROM runtime AS zbctl
ENTRYPOINT ["/usr/local/bin/zbctl"]

# Last, so a plain `docker build .` makes the coordinator. Its defaults
# listen on loopback only: give --config (deploy/k8s mounts one) or
# --listen/--metrics-listen.
FROM runtime AS coordinator
EXPOSE 7070 9464
ENTRYPOINT ["/usr/local/bin/zb-coordinator"]
