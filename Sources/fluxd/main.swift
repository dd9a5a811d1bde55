print("fluxd")
