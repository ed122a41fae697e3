# One image for every podcert subcommand (signer, shim, audit, ...). It cannot be built on the
# development machines (no container runtime there); it is deliberately plain.
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY podcert ./podcert
COPY signer ./signer
COPY kubelet_shim ./kubelet_shim
COPY bundles ./bundles
COPY devcluster ./devcluster
COPY examples ./examples
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

FROM python:3.11-slim
RUN useradd --uid 65532 --user-group --no-create-home --shell /usr/sbin/nologin podcert
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels
USER 65532:65532
ENTRYPOINT ["podcert"]
CMD ["--help"]
