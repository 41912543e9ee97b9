import torch
from torch.optim import AdamW
from yolotrain import Yolov5, YOLO_LOSS, get_loaders

def main():
    model = Yolov5(version='l')
    print(f"{sum(p.numel() for p in model.parameters())/1e6} million parameters")
    criterion = YOLO_LOSS(model, rect_training=True)
    optimizer = AdamW(model.parameters(), lr=0.5)
    num_epochs = 5
    train_loader, val_loader = get_loaders(db_root_dir="./datasets", batch_size=2, num_classes=2)
    for epoch in range(num_epochs):
        model.train()
        epoch_loss = 0
        for imgs, targets in train_loader:
            torch.autograd.set_detect_anomaly(True)
            outputs = model(imgs)
            loss = criterion(outputs, targets, pred_size=imgs.shape[2:4])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            epoch_loss += loss.item()
        print(f"Epoch {epoch+1}/{num_epochs} | Loss: {epoch_loss/len(train_loader)}")

if __name__ == "__main__":
    main()
