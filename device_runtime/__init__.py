"""The device agent (edgefl.device_runtime). Never imports torch at import time: a device may run
ONNX Runtime training with numpy, paho-mqtt and psutil alone."""
