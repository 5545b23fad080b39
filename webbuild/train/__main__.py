from webbuild.train.train import main

main()
