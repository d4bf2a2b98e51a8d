# The broker image for compose.yaml (Kafka comes from the official apache/kafka image there).
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml setup.py README.md ./
COPY common common
COPY broker broker
COPY adapters adapters
COPY ops ops
COPY avro avro
RUN pip install --no-cache-dir -e .
EXPOSE 9120
ENTRYPOINT ["apexps"]
