"""A TLS terminator in front of a plaintext Kafka-protocol broker, for Chronik's tests (tansu
0.6 takes --cert and --key but still listens in plaintext). Python 3 standard library only.

    python3 tls_proxy.py LISTEN_PORT BROKER_PORT CERT KEY [CLIENT_CA]

Listens on 127.0.0.1:LISTEN_PORT with CERT and KEY and forwards each connection's bytes to
127.0.0.1:BROKER_PORT and back; with CLIENT_CA, a client must show a certificate CLIENT_CA
signed (mutual TLS). Prints "ready" once it listens. The broker must advertise LISTEN_PORT.
"""

import asyncio
import ssl
import sys


async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            data = await reader.read(65536)
            if not data:
                break
            writer.write(data)
            await writer.drain()
    except (ConnectionError, ssl.SSLError, OSError):
        pass
    finally:
        writer.close()


async def main() -> None:
    listen, broker, cert, key = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    if len(sys.argv) > 5:
        context.verify_mode = ssl.CERT_REQUIRED
        context.load_verify_locations(sys.argv[5])

    async def handle(client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        try:
            broker_reader, broker_writer = await asyncio.open_connection("127.0.0.1", broker)
        except OSError:
            client_writer.close()
            return
        await asyncio.gather(pipe(client_reader, broker_writer), pipe(broker_reader, client_writer))

    server = await asyncio.start_server(handle, "127.0.0.1", listen, ssl=context)
    print("ready", flush=True)
    async with server:
        await server.serve_forever()


asyncio.run(main())
