"""Device profiles (YAML package data, each number with its source) and, later, energy-meter drivers."""
from edgefl.hardware.profiles import DeviceProfile, load_profile, profile_names

__all__ = ["DeviceProfile", "load_profile", "profile_names"]
