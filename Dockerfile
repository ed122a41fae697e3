# One image for every podcert subcommand that runs in a cluster: signer, shim, audit. The
# development tools (devcluster, the demo), the example workloads, benches and tests are not
# copied, so the wheel built here holds only podcert, signer, kubelet_shim, audit and bundles
# (pyproject's package list finds only what is present). Issue 16 builds and runs it for real.
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY podcert ./podcert
COPY signer ./signer
COPY kubelet_shim ./kubelet_shim
COPY audit ./audit
COPY bundles ./bundles
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

FROM python:3.11-slim
RUN useradd --uid 65532 --user-group --no-create-home --shell /usr/sbin/nologin podcert
# A bind mount, so the wheels never become a layer of the final image.
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    pip install --no-cache-dir /wheels/*.whl
USER 65532:65532
ENTRYPOINT ["podcert"]
CMD ["--help"]
