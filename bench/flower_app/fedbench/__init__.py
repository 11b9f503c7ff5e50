"""FedAvg on the 2-conv CNN: the Flower app (server_app, client_app) and the training code it shares with
bench/lean_fedavg.py (task, which imports only torch and numpy)."""
