from pipeline.train.train import main

main()
