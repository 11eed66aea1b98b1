"""posexp's Hydra configs, shipped inside the package as ``posexp.configs`` so an installed wheel finds them."""
