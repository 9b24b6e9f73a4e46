def main(argv=None):
    print("fedsbdt")
