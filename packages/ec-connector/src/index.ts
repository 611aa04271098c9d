export const PACKAGE_NAME = "@tapwire/ec-connector";
