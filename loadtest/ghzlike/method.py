"""The called method, found in a .proto file or by server reflection, and the requests sent to it.

As ghz does: with `proto`, compile that file with protoc (grpcio-tools' bundled one) over the
file's own directory, `import-paths` and "." (ghz's order); without it, ask the server's
reflection service for the file that defines the service. Either way the message classes come
from those descriptors (descriptor_pool + message_factory), and the config's JSON data is parsed
with json_format, the proto3 JSON mapping ghz uses too. Data without template actions is parsed
once; data with actions is rendered and parsed for every call, like ghz's data provider. An
array is sent round-robin by request number.
"""

from __future__ import annotations

import collections
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool, json_format, message_factory
from google.protobuf.descriptor import MethodDescriptor
from google.protobuf.message import Message
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)

from loadtest.ghzlike.config import ConfigError, LoadConfig
from loadtest.ghzlike.templates import CallData, has_actions, render

__all__ = [
    "Method",
    "RequestSource",
    "import_paths_of",
    "method_in",
    "proto_pool",
    "resolve_from_proto",
    "resolve_method",
    "split_call",
]


@dataclass(frozen=True)
class Method:
    """A unary method: its path on the wire and its message classes."""

    descriptor: MethodDescriptor
    request_class: type[Message]
    response_class: type[Message]

    @property
    def path(self) -> str:
        return f"/{self.descriptor.containing_service.full_name}/{self.descriptor.name}"

    def callable(self, channel: grpc.Channel) -> grpc.UnaryUnaryMultiCallable[Message, Message]:
        multicallable: grpc.UnaryUnaryMultiCallable[Message, Message] = channel.unary_unary(
            self.path,
            request_serializer=self.request_class.SerializeToString,
            response_deserializer=self.response_class.FromString,
        )
        return multicallable

    def call_data(self, worker_id: str, request_number: int) -> CallData:
        service = self.descriptor.containing_service
        return CallData(
            worker_id=worker_id,
            request_number=request_number,
            fully_qualified_name=self.descriptor.full_name,
            method_name=self.descriptor.name,
            service_name=service.name,
            input_name=self.descriptor.input_type.name,
            output_name=self.descriptor.output_type.name,
        )


def split_call(call: str) -> tuple[str, str]:
    """`package.Service/Method` or `package.Service.Method` -> (service, method), as ghz."""
    text = call.strip().lstrip("/")
    service, slash, method = text.rpartition("/")
    if not slash:
        service, _, method = text.rpartition(".")
    if not service or not method:
        raise ConfigError(f"call: {call!r} is not package.Service/Method")
    return service, method


def import_paths_of(config: LoadConfig) -> tuple[str, ...]:
    """ghz's include path for `proto`: the file's directory, then `import-paths`, then "."."""
    return (os.path.dirname(config.proto) or ".", *config.import_paths, ".")


def proto_pool(config: LoadConfig) -> descriptor_pool.DescriptorPool:
    """The descriptors of `config.proto` and its imports, compiled by protoc (ConfigError if
    protoc refuses the file, with protoc's own message)."""
    spec = importlib.util.find_spec("grpc_tools")
    if spec is None or spec.origin is None:
        raise ConfigError("proto: reading .proto files needs grpcio-tools (the dev extra)")
    well_known = os.path.join(os.path.dirname(spec.origin), "_proto")
    includes = [f"-I{path}" for path in (*import_paths_of(config), well_known)]
    with tempfile.TemporaryDirectory(prefix="gpualloc-load-") as tmp:
        out = os.path.join(tmp, "descriptors.pb")
        command = [sys.executable, "-m", "grpc_tools.protoc", *includes, "--include_imports",
                   f"--descriptor_set_out={out}", config.proto]  # fmt: skip
        done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
        if done.returncode != 0:
            raise ConfigError(f"proto: protoc cannot compile {config.proto}: {done.stderr.strip()}")
        with open(out, "rb") as file:
            files = descriptor_pb2.FileDescriptorSet.FromString(file.read())
    pool = descriptor_pool.DescriptorPool()
    for file_proto in files.file:  # protoc writes imports before the files that use them
        pool.Add(file_proto)
    return pool


def resolve_method(
    channel: grpc.Channel, call: str, reflect_metadata: dict[str, str] | None = None
) -> Method:
    """Find `call` through the server's reflection service (raises ConfigError if absent)."""
    if reflect_metadata:
        channel = grpc.intercept_channel(channel, _ReflectMetadata(reflect_metadata))
    database = ProtoReflectionDescriptorDatabase(channel)
    pool = descriptor_pool.DescriptorPool(database)
    try:
        return method_in(pool, call, lambda: sorted(database.get_services()), "the server")
    except grpc.RpcError as error:
        raise ConfigError(
            f"call: server reflection failed ({error.code().name}: {error.details()}); "
            "without --proto the Python runner needs the server's reflection service"
        ) from None


def resolve_from_proto(config: LoadConfig) -> Method:
    """Find `config.call` among the services of `config.proto` (ghz's `proto` option)."""
    pool = proto_pool(config)
    file = pool.FindFileByName(os.path.basename(config.proto))
    return method_in(pool, config.call, lambda: sorted(file.services_by_name), config.proto)


def method_in(
    pool: descriptor_pool.DescriptorPool, call: str, services: Callable[[], list[str]], where: str
) -> Method:
    """`call` in `pool`; ConfigError naming what `where` has when it is not there."""
    service_name, method_name = split_call(call)
    try:
        service = pool.FindServiceByName(service_name)
    except KeyError:
        known = ", ".join(services())
        raise ConfigError(
            f"call: {where} has no service {service_name!r} (it has: {known})"
        ) from None
    method = service.methods_by_name.get(method_name)
    if method is None:
        known = ", ".join(sorted(service.methods_by_name))
        raise ConfigError(f"call: {service_name} has no method {method_name!r} (it has: {known})")
    if method.client_streaming or method.server_streaming:
        raise ConfigError(f"call: {call} streams; the Python runner calls unary methods only")
    return Method(
        method,
        message_factory.GetMessageClass(method.input_type),
        message_factory.GetMessageClass(method.output_type),
    )


class _CallDetails(
    collections.namedtuple(
        "_CallDetails",
        ("method", "timeout", "metadata", "credentials", "wait_for_ready", "compression"),
    ),
    grpc.ClientCallDetails,
):
    pass


class _ReflectMetadata(grpc.StreamStreamClientInterceptor):
    """ghz's `reflect-metadata`: metadata sent with the reflection calls only."""

    def __init__(self, metadata: dict[str, str]) -> None:
        self._pairs = tuple((k.lower(), v) for k, v in metadata.items())

    def intercept_stream_stream(self, continuation: Any, details: Any, requests: Any) -> Any:
        metadata = (*(details.metadata or ()), *self._pairs)
        changed = _CallDetails(
            details.method,
            details.timeout,
            metadata,
            details.credentials,
            details.wait_for_ready,
            details.compression,
        )
        return continuation(changed, requests)


class RequestSource:
    """Builds the request of call number n: parsed once when static, rendered when templated."""

    def __init__(self, method: Method, config: LoadConfig) -> None:
        self._method = method
        self._functions = not config.disable_template_functions
        self._templated = not config.disable_template_data
        items = config.data if isinstance(config.data, list) else [config.data or {}]
        self._texts = [json.dumps(item) for item in items]
        self._metadata_text = json.dumps(config.metadata) if config.metadata else ""
        self._cached: list[Message | None] = [
            None if self._templated and has_actions(text) else self._parse(text)
            for text in self._texts
        ]
        self._metadata_templated = self._templated and has_actions(self._metadata_text)
        self._metadata = self._parse_metadata(self._metadata_text)

    def request(self, request_number: int, worker_id: str) -> Message:
        index = request_number % len(self._texts)
        cached = self._cached[index]
        if cached is not None:
            return cached
        text = render(self._texts[index], self._data(worker_id, request_number), **self._kw())
        return self._parse(text)

    def metadata(self, request_number: int, worker_id: str) -> tuple[tuple[str, str], ...] | None:
        if not self._metadata_templated:
            return self._metadata
        text = render(self._metadata_text, self._data(worker_id, request_number), **self._kw())
        return self._parse_metadata(text)

    def check(self) -> None:
        """Render and parse call 0 now, so a bad template or field fails before the run."""
        for number in range(len(self._texts)):
            self.request(number, "g0c0")
        self.metadata(0, "g0c0")

    def _kw(self) -> dict[str, Any]:
        return {"functions": self._functions}

    def _data(self, worker_id: str, request_number: int) -> CallData:
        return self._method.call_data(worker_id, request_number)

    def _parse(self, text: str) -> Message:
        message = self._method.request_class()
        try:
            json_format.Parse(text, message)
        except json_format.ParseError as error:
            name = self._method.request_class.DESCRIPTOR.full_name
            raise ConfigError(f"data: not a valid {name}: {error}") from None
        return message

    @staticmethod
    def _parse_metadata(text: str) -> tuple[tuple[str, str], ...] | None:
        if not text:
            return None
        pairs = json.loads(text)
        return tuple((str(k).lower(), str(v)) for k, v in pairs.items())
