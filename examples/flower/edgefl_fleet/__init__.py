"""An edgefl fleet as a Flower App (edgefl.flower.app builds both apps from the run config)."""
