# The inferwatch image: the wheel and the dependencies pinned in requirements.lock, in a venv,
# run as uid 65532 with nothing but the console script as its entry point. Build it with
# scripts/build-image (docs/install.md), which puts the wheels in the build context, so the
# build reaches no index. BASE: any image with python3 (3.11+) and its venv module.
ARG BASE=python:3.11-slim-bookworm

FROM ${BASE} AS build
WORKDIR /src
COPY requirements.lock ./
COPY dist/ ./dist/
RUN python3 -m venv /opt/inferwatch \
    && /opt/inferwatch/bin/pip install --no-cache-dir --no-index --find-links=./dist \
        --requirement requirements.lock \
    && /opt/inferwatch/bin/pip install --no-cache-dir --no-index --no-deps ./dist/inferwatch-*.whl \
    && /opt/inferwatch/bin/pip uninstall --yes pip setuptools

FROM ${BASE}
ARG VERSION=0.1.0
ARG REVISION=unknown
LABEL org.opencontainers.image.title="inferwatch" \
      org.opencontainers.image.description="Observability and SRE toolkit for LLM inference fleets" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.source="https://github.com/inferwatch/inferwatch" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /opt/inferwatch /opt/inferwatch
ENV PATH=/opt/inferwatch/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
USER 65532:65532
ENTRYPOINT ["inferwatch"]
