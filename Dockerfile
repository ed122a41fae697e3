# One image for every podcert subcommand that runs in a cluster: signer, shim, audit. The
# development tools (devcluster, the demo), the example workloads, benches and tests are not
# copied; the wheel built here holds podcert, signer, kubelet_shim, audit and bundles, as every
# wheel of podcert does, and the runtime lock is the base plus the `server` extra. `podcert
# devcluster image` builds it on this machine and checks the result (devcluster/imagebuild.py).
#
# The final image takes only installed files from the stages before it (`pip install --root`
# into a folder, then COPY --from): no wheel, lock or pip cache reaches any of its layers, and
# COPY --from is cached by content (a RUN --mount from a stage is not, in buildah 1.28: it would
# reuse a layer holding an older podcert).

# The dependencies from the runtime lock (hashes checked): rebuilt only when the lock changes.
FROM python:3.11-slim AS deps
COPY locks/runtime.txt /tmp/
RUN pip install --no-cache-dir --require-hashes --root=/install -r /tmp/runtime.txt

# podcert's own wheel, built by pip and the build backend at their locked versions, then
# installed with nothing left to resolve.
FROM python:3.11-slim AS build
WORKDIR /src
COPY locks/build.txt ./locks/
RUN pip install --no-cache-dir --require-hashes -r locks/build.txt
COPY pyproject.toml README.md ./
COPY podcert ./podcert
COPY signer ./signer
COPY kubelet_shim ./kubelet_shim
COPY audit ./audit
COPY bundles ./bundles
RUN pip wheel --no-cache-dir --no-deps --no-build-isolation --wheel-dir /wheels . \
    && pip install --no-cache-dir --no-deps --root=/install /wheels/podcert-*.whl

FROM python:3.11-slim
# One uid and one gid, both named: `USER 65532:65532` then runs as podcert:podcert (useradd
# --user-group alone would pick the next free gid, 1000, leaving 65532 without a name).
RUN groupadd --gid 65532 podcert \
    && useradd --uid 65532 --gid 65532 --no-create-home --home-dir /nonexistent \
        --shell /usr/sbin/nologin podcert
COPY --from=deps /install/usr/local /usr/local
COPY --from=build /install/usr/local /usr/local
USER 65532:65532
ENTRYPOINT ["podcert"]
CMD ["--help"]
