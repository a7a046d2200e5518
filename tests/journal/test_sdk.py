"""The mcp SDK's private names the project relies on (`journal.sdk`) are all still there."""

from importlib.metadata import version

from journal import sdk


def test_every_private_name_of_the_sdk_that_the_project_uses_is_there():
    gone = sdk.missing()
    assert gone == [], (
        f"the installed mcp {version('mcp')} no longer has {', '.join(gone)}: journal/sdk.py was written "
        f"against mcp {sdk.SDK_VERSION}; reach the same through the new SDK there (and only there)")


def test_the_installed_sdk_is_the_minor_version_the_names_were_written_against():
    installed = version("mcp")
    assert installed.split(".")[:2] == sdk.SDK_VERSION.split("."), (
        f"mcp {installed} is installed; journal/sdk.py was written against mcp {sdk.SDK_VERSION}")


def test_a_name_the_sdk_lacks_is_reported(monkeypatch):
    monkeypatch.setattr(
        sdk,
        "PRIVATE_NAMES",
        (
            *sdk.PRIVATE_NAMES,
            ("mcp.client.stdio", None, "_no_such_thing"),
            ("mcp.client.client", "Client", "_nor_this"),
        ),
    )
    assert sdk.missing() == ["mcp.client.stdio._no_such_thing", "mcp.client.client.Client._nor_this"]
