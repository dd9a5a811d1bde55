print("fluxctl")
