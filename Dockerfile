# syntax=docker/dockerfile:1
#
# idemproxy image, and the upstream stub used by deploy/compose.yaml.
#
#   docker build -t idemproxy:dev --build-arg VERSION=$(git describe --always --dirty) .
#   docker build -t idemproxy-stub:dev --target stub .
#
# The last stage (idemproxy) is the default target.

# ---------------------------------------------------------------------------
# Build stages
# ---------------------------------------------------------------------------
FROM golang:1.26-bookworm AS src
WORKDIR /src
ENV CGO_ENABLED=0
# Module download in its own layer: it is rebuilt only when go.mod/go.sum change.
COPY go.mod go.sum ./
RUN go mod download && go mod verify
COPY . .

FROM src AS build
ARG VERSION=dev
RUN go build -trimpath -ldflags "-s -w -X github.com/idemproxy/idemproxy/internal/app/buildinfo.version=${VERSION}" -o /out/idemproxy . \
 && /out/idemproxy -check -config deploy/container-config.yaml
# distroless has no shell: the data directory is prepared here and copied with
# its owner set to the nonroot user (65532).
RUN mkdir -p /out/data

FROM src AS build-stub
RUN go build -trimpath -ldflags "-s -w" -o /out/upstream-stub ./upstream-stub

# ---------------------------------------------------------------------------
# stub: the non-idempotent charge service used for demos and tests
# (docker build --target stub). Not for production.
# ---------------------------------------------------------------------------
FROM gcr.io/distroless/static-debian12:nonroot AS stub
LABEL org.opencontainers.image.title="idemproxy-upstream-stub" \
      org.opencontainers.image.description="Non-idempotent charge service used to demonstrate idemproxy" \
      org.opencontainers.image.source="https://github.com/idemproxy/idemproxy" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build-stub /out/upstream-stub /usr/local/bin/upstream-stub
# idemproxy's -healthcheck is the probe (the image has no shell or curl).
COPY --from=build /out/idemproxy /usr/local/bin/idemproxy
USER 65532:65532
EXPOSE 9000
HEALTHCHECK --interval=10s --timeout=3s --start-period=5s --retries=3 \
  CMD ["/usr/local/bin/idemproxy", "-healthcheck", "http://127.0.0.1:9000/healthz"]
ENTRYPOINT ["/usr/local/bin/upstream-stub"]
CMD ["-listen", "0.0.0.0:9000"]

# ---------------------------------------------------------------------------
# idemproxy (default target)
# ---------------------------------------------------------------------------
FROM gcr.io/distroless/static-debian12:nonroot AS idemproxy
ARG VERSION=dev
LABEL org.opencontainers.image.title="idemproxy" \
      org.opencontainers.image.description="Sidecar reverse proxy that makes an unmodified HTTP service idempotent" \
      org.opencontainers.image.source="https://github.com/idemproxy/idemproxy" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}"
COPY --from=build /out/idemproxy /usr/local/bin/idemproxy
# config.yaml is the container configuration (listens on 0.0.0.0, Badger in
# /var/lib/idemproxy). Mount your own over it, or pass -config.
# config.example.yaml is the documented reference of every option.
COPY deploy/container-config.yaml /etc/idemproxy/config.yaml
COPY config.example.yaml /etc/idemproxy/config.example.yaml
# Badger data. Put it on a volume: keys written to the container's own
# filesystem are lost with the container, and a lost key lets a duplicate
# through.
COPY --from=build --chown=65532:65532 /out/data /var/lib/idemproxy
VOLUME /var/lib/idemproxy
# 8080: proxied traffic. 9091: admin (/metrics, /livez, /readyz, /v1/keys).
EXPOSE 8080 9091
HEALTHCHECK --interval=15s --timeout=3s --start-period=10s --retries=3 \
  CMD ["/usr/local/bin/idemproxy", "-healthcheck", "http://127.0.0.1:9091/livez"]
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/idemproxy"]
CMD ["-config", "/etc/idemproxy/config.yaml"]
