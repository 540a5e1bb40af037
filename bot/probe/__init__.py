"""The probe and its transports: the script and its sections, runners, the SSH pool, Proxmox, targets, checkup."""
