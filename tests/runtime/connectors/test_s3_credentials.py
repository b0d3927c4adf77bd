"""Wrong S3 credentials against moto's server with authentication switched on (moto
checks access keys against its IAM once ``INITIAL_NO_AUTH_ACTION_COUNT`` requests have
passed; 0: from the first): the sink and the file source name the URL and the fix."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import boto3
import pytest

from runtime.connectors.files import FileStreamSource
from runtime.connectors.parquet import ParquetSink
from runtime.errors import ConnectorError
from tests.conftest import FakeS3

ALLOW_S3 = {
    "Version": "2012-10-17",
    "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}],
}


@pytest.fixture
def s3_auth(s3: FakeS3, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    """Authentication on for this test; yields storage options of an IAM user allowed s3:*."""
    from moto import settings

    iam = boto3.client(
        "iam",
        endpoint_url=s3.endpoint,
        aws_access_key_id="absflow-test-key",
        aws_secret_access_key="absflow-test-secret",
        region_name="us-east-1",
    )
    name = f"absflow-{time.monotonic_ns()}"
    iam.create_user(UserName=name)
    iam.put_user_policy(UserName=name, PolicyName="s3", PolicyDocument=json.dumps(ALLOW_S3))
    key = iam.create_access_key(UserName=name)["AccessKey"]
    monkeypatch.setattr(settings, "INITIAL_NO_AUTH_ACTION_COUNT", 0)
    yield {**s3.options, "key": key["AccessKeyId"], "secret": key["SecretAccessKey"]}


def test_wrong_s3_credentials_are_named_by_the_parquet_sink(
    s3: FakeS3, s3_auth: dict[str, Any]
) -> None:
    url = s3.url(f"out-{time.monotonic_ns()}")
    ParquetSink(url, storage_options=s3_auth).check_system("files")  # the right key works
    started = time.monotonic()
    with pytest.raises(ConnectorError) as info:
        ParquetSink(url, storage_options={**s3_auth, "key": "wrong"}).check_system("files")
    assert time.monotonic() - started < 10
    message = str(info.value)
    assert url in message and "Access Key Id" in message and "credentials" in message


def test_wrong_s3_credentials_are_named_by_the_file_source(
    s3: FakeS3, s3_auth: dict[str, Any]
) -> None:
    url = s3.url(f"in-{time.monotonic_ns()}")
    started = time.monotonic()
    with pytest.raises(ConnectorError) as info:
        FileStreamSource(url, storage_options={**s3_auth, "key": "wrong"}).validate("files")
    assert time.monotonic() - started < 10
    message = str(info.value)
    assert url in message and "Access Key Id" in message and "check the credentials" in message
