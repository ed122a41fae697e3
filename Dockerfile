# One image for every podcert subcommand that runs in a cluster: signer, shim, audit. The
# development tools (devcluster, the demo), the example workloads, benches and tests are not
# copied, so the wheel built here holds only podcert, signer, kubelet_shim, audit and bundles
# (pyproject's package list finds only what is present). Issue 16 builds and runs it for real.
FROM python:3.11-slim AS build
WORKDIR /src
# pip and the build backend at their locked versions, so the wheel is built with nothing resolved.
COPY locks/build.txt ./locks/
RUN pip install --no-cache-dir --require-hashes -r locks/build.txt
COPY pyproject.toml README.md ./
COPY podcert ./podcert
COPY signer ./signer
COPY kubelet_shim ./kubelet_shim
COPY audit ./audit
COPY bundles ./bundles
RUN pip wheel --no-cache-dir --no-deps --no-build-isolation --wheel-dir /wheels .

FROM python:3.11-slim
RUN useradd --uid 65532 --user-group --no-create-home --shell /usr/sbin/nologin podcert
# The dependencies from the runtime lock (hashes checked), then podcert's own wheel with nothing
# left to resolve; bind mounts, so neither the lock nor the wheels become a layer.
RUN --mount=type=bind,source=locks/runtime.txt,target=/tmp/runtime.txt \
    --mount=type=bind,from=build,source=/wheels,target=/wheels \
    pip install --no-cache-dir --require-hashes -r /tmp/runtime.txt \
    && pip install --no-cache-dir --no-deps /wheels/*.whl
USER 65532:65532
ENTRYPOINT ["podcert"]
CMD ["--help"]
