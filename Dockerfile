# delayd and delayctl in one small image: static binaries (CGO_ENABLED=0) on distroless, run as a non-root user.
#
#   docker build -t delayd .
#   docker run --rm -e DELAYD_NATS_URL=nats://nats:4222 -p 8223:8223 delayd
#
# The build stage's Go version is go.mod's. deploy/dockerfile_test.go checks this file: the go build command below
# builds with CGO_ENABLED=0, its packages are cmd/ commands, the runtime stage runs as non-root. See
# docs/operations.md#container-image.

FROM golang:1.26.8 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ENV CGO_ENABLED=0
RUN go build -trimpath -ldflags='-s -w' -o /out/ ./cmd/delayd ./cmd/delayctl
# The embedded server's store, owned by the runtime user (distroless has no shell to create it there).
RUN mkdir -p /out/data

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/delayd /out/delayctl /usr/local/bin/
COPY --from=build --chown=65532:65532 /out/data /var/lib/delayd
# distroless's nonroot user.
USER 65532:65532
# Health, readiness and metrics on every interface, so probes and Prometheus reach them. With no DELAYD_NATS_URL
# delayd starts its embedded server, storing in the volume; that server listens on loopback unless DELAYD_LISTEN says
# otherwise (it has no authentication: see docs/operations.md#security).
ENV DELAYD_HTTP_ADDR=0.0.0.0:8223 \
    DELAYD_STORE_DIR=/var/lib/delayd \
    DELAYD_LOG_FORMAT=json
VOLUME /var/lib/delayd
EXPOSE 8223 4222
ENTRYPOINT ["/usr/local/bin/delayd"]
