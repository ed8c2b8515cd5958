"""Generated protobuf and gRPC stubs for Tocsin's ``tocsin.v1`` API.

``timer_pb2``/``timer_pb2_grpc`` (TimerService) and ``admin_pb2``/
``admin_pb2_grpc`` (AdminService) are generated from ``proto/tocsin/v1`` by
``clients/python/generate.sh``; do not edit them by hand.
"""
