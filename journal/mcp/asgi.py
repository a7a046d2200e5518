"""Small ASGI helpers shared by the Recorder's own request handling."""


async def read_body(receive) -> bytes:
    """The whole request body, however many messages it arrives in."""
    body, more = b"", True
    while more:
        message = await receive()
        body += message.get("body", b"")
        more = message.get("more_body", False)
    return body
